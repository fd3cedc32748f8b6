"""A base for stores: every optional method refuses with :class:`Unsupported` until the
store overrides it, and ``capabilities`` lists exactly the overridden ones."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import NoReturn

from loom_core.errors import Unsupported
from loom_core.events import Event, NewEvent
from loom_core.protocols import (
    OPTIONAL_EVENT_STORE_METHODS,
    AppendRequest,
    ConditionalFence,
    OptionalMethod,
)

__all__ = ["RefusesUnoffered"]


class RefusesUnoffered:
    """Mixin for an event store: optional methods it does not override raise Unsupported.

    ``capabilities`` is computed from the overrides, so a store cannot claim a method it
    lacks or forget one it has. A store that offers less at run time (a configuration
    switch) overrides ``capabilities`` to return the narrower set, and has each method it
    withholds call ``self._refuse(method, reason)``, which raises Unsupported
    (``MemoryEventStore(offer=...)`` does so).
    """

    __slots__ = ()

    @property
    def capabilities(self) -> frozenset[OptionalMethod]:
        own = type(self)
        return frozenset(
            m for m in OPTIONAL_EVENT_STORE_METHODS
            if getattr(own, m) is not getattr(RefusesUnoffered, m)
        )

    def _refuse(self, method: str, reason: str | None = None) -> NoReturn:
        raise Unsupported(method, type(self).__name__, reason)

    async def acquire_fence(self, execution_id: str) -> int:
        self._refuse("acquire_fence")

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        self._refuse("acquire_fence_if")

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        self._refuse("append_if_unchanged")

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        self._refuse("append_many")

    async def delete_execution(self, execution_id: str) -> bool:
        self._refuse("delete_execution")

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        self._refuse("copy_prefix")

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        self._refuse("truncate_prefix_keeping")

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        self._refuse("subscribe")
