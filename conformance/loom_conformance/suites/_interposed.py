"""An event store in front of the one under test, for the runtime suite: it can withhold
optional methods and step in before each conditional acquire.

The runtime suite needs two things no store does by itself, on whatever store it is
given: a store *without* some optional method (to drive the runtime's fallbacks over a
store that offers it), and a rival that takes the fence at an exact moment (just before
each ``acquire_fence_if``), so a race is forced rather than hoped for. Everything else is
forwarded unchanged, so the store under test still decides every write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, final

from loom_core import Event, EventStore, NewEvent, Unsupported

if TYPE_CHECKING:
    # Types of the store protocol, from the module that defines them.
    from loom_core.spi import AppendRequest, ConditionalFence, OptionalMethod

__all__ = ["AroundAppend", "BeforeAcquire", "InterposedEventStore"]

BeforeAcquire = Callable[[str], Awaitable[None]]
"""Runs with the execution id just before each ``acquire_fence_if`` is forwarded."""

AroundAppend = Callable[[str, tuple[str, ...]], Awaitable[None]]
"""Runs with the execution id and the kinds of an ``append``'s events: before it is
forwarded (the write has not reached the store), or after the store wrote it and before
its caller hears back (the window a slow reply leaves)."""


@final
class InterposedEventStore:
    """Forwards to ``inner``, except: each method in ``withhold`` is absent from
    ``capabilities`` and raises ``Unsupported``; ``before_acquire_if`` (settable at any
    time, None to stop) runs before each forwarded ``acquire_fence_if``, and
    ``before_acquire_fence`` before each ``acquire_fence``; ``before_append`` and
    ``after_append`` (the same) run around each forwarded ``append``, and
    ``after_read(execution_id)`` after each ``read`` answered. ``calls`` counts
    the optional methods asked for, withheld ones included.

    ``close`` does not close ``inner``: the store under test belongs to whoever opened it.
    """

    __slots__ = (
        "_inner", "_withheld", "after_append", "after_read", "before_acquire_fence",
        "before_acquire_if", "before_append", "calls",
    )

    def __init__(
        self,
        inner: EventStore,
        *,
        withhold: Collection[OptionalMethod] = (),
        before_acquire_if: BeforeAcquire | None = None,
    ) -> None:
        self._inner = inner
        self._withheld = frozenset(withhold)
        self.before_acquire_if = before_acquire_if
        self.before_append: AroundAppend | None = None
        self.after_append: AroundAppend | None = None
        self.before_acquire_fence: BeforeAcquire | None = None
        self.after_read: Callable[[str], None] | None = None
        self.calls: dict[str, int] = {}

    def __repr__(self) -> str:
        withheld = ", ".join(sorted(self._withheld)) or "nothing"
        return f"InterposedEventStore({self._inner!r}, withholding {withheld})"

    @property
    def capabilities(self) -> frozenset[OptionalMethod]:
        return self._inner.capabilities - self._withheld

    def _optional(self, method: OptionalMethod) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if method in self._withheld:
            raise Unsupported(method, repr(self), "withheld by the runtime suite")

    # -- required ----------------------------------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        if self.before_append is not None:
            await self.before_append(execution_id, tuple(e.kind for e in events))
        written = await self._inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )
        if self.after_append is not None:
            await self.after_append(execution_id, tuple(e.kind for e in events))
        return written

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        got = await self._inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )
        if self.after_read is not None:
            self.after_read(execution_id)
        return got

    async def head(self, execution_id: str) -> int:
        return await self._inner.head(execution_id)

    async def list_executions(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[str, ...]:
        return await self._inner.list_executions(after=after, limit=limit)

    async def close(self) -> None:
        return None

    # -- optional ----------------------------------------------------------------------

    async def acquire_fence(self, execution_id: str) -> int:
        self._optional("acquire_fence")
        if self.before_acquire_fence is not None:
            await self.before_acquire_fence(execution_id)
        return await self._inner.acquire_fence(execution_id)

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        self._optional("acquire_fence_if")
        if self.before_acquire_if is not None:
            await self.before_acquire_if(execution_id)
        return await self._inner.acquire_fence_if(execution_id, fence=fence, park_seq=park_seq)

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        self._optional("append_if_unchanged")
        return await self._inner.append_if_unchanged(
            execution_id, events, expected_sequence=expected_sequence,
            observed_fence=observed_fence,
        )

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        self._optional("append_many")
        return await self._inner.append_many(requests)

    async def delete_execution(self, execution_id: str) -> bool:
        self._optional("delete_execution")
        return await self._inner.delete_execution(execution_id)

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        self._optional("copy_prefix")
        return await self._inner.copy_prefix(source, target, through_sequence=through_sequence)

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        self._optional("truncate_prefix_keeping")
        return await self._inner.truncate_prefix_keeping(
            execution_id, keep_from_sequence=keep_from_sequence
        )

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        self._optional("subscribe")
        return self._inner.subscribe(execution_id, from_sequence=from_sequence)
