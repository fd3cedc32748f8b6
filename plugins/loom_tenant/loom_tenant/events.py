"""The tenant-scoped event store: one tenant's view of a shared inner event store."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager
from typing import NoReturn

from loom_core import Event, NewEvent
from loom_core.decorating import Decisions, EventStoreDecorator, Implement
from loom_core.errors import InvalidInputError, LoomError, StorageReadError, StoreClosedError
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    AppendRequest,
    ConditionalFence,
    EventStore,
    build_event,
    check_append,
    check_append_requests,
    check_fence,
    check_limit,
    check_read,
    check_sequence,
)
from loom_tenant.codec import TenantCodec
from loom_tenant.scrubbing import scrub, tenant_errors

__all__ = ["TenantEventStore"]


class TenantEventStore(EventStoreDecorator):
    """Every execution id is encoded under one tenant before it reaches ``inner``, and
    decoded on the way back: events, lists and errors carry the tenant's own ids.

    Every optional method rewrites ids, so each is implemented here and offered exactly
    when the inner store offers it. ``append_many`` needs no cross-tenant check: every
    request's id is encoded under this tenant, so a batch is the tenant's by construction.
    ``copy_prefix`` copies within the tenant (source and target both encoded).

    ``owns_inner`` (default True) makes :meth:`close` close the inner store; a view over a
    store shared by several tenants passes False.
    """

    def __init__(self, inner: EventStore, tenant: str, *, owns_inner: bool = True) -> None:
        super().__init__(inner)
        self.codec = TenantCodec(tenant)
        self._prefix = self.codec.prefix
        self._budget = self.codec.id_budget
        self._owns_inner = owns_inner
        self._closed = False

    @property
    def tenant(self) -> str:
        return self.codec.tenant

    def __repr__(self) -> str:
        return f"TenantEventStore({self.tenant!r}, {self.inner!r})"

    def _restore(self, events: Sequence[Event], execution_id: str) -> tuple[Event, ...]:
        expected = self.codec.prefix + execution_id
        if len(events) == 1:  # what most appends write
            (event,) = events
            if event.execution_id == expected:
                return (_readdressed(event, execution_id),)
        out = []
        for event in events:
            # Defence in depth: an inner store that answered for another id must not hand
            # another tenant's event to this one.
            if event.execution_id != expected:
                raise StorageReadError(
                    f"the inner store returned an event of another execution while reading "
                    f"{execution_id!r} for tenant {self.tenant!r}; refusing to pass it on"
                )
            out.append(_readdressed(event, execution_id))
        return tuple(out)

    # -- required -----------------------------------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        # Every append's path: the common id (printable ASCII within the budget) is
        # encoded inline, as codec.encode would; anything else goes to it, which decides.
        if (
            type(execution_id) is str
            and 0 < len(execution_id) <= self._budget
            and execution_id.isascii()
            and execution_id.isprintable()
        ):
            stored = self._prefix + execution_id
        else:
            stored = self.codec.encode(execution_id)
        if self._closed:
            # Bad input is refused as bad input, closed or not (checked here only when
            # closed: the inner store checks it on the way through).
            check_append(execution_id, events, expected_sequence)
            if fence is not None:
                check_fence(fence)
            self._refuse_closed()
        # What _errors does, without a context manager.
        try:
            written = await self.inner.append(
                stored, events, expected_sequence=expected_sequence, fence=fence
            )
        except LoomError as error:
            scrub(error, self.codec, (execution_id,))
            raise
        if len(written) == 1 and written[0].execution_id == stored:  # _restore, inlined
            event = written[0]
            return (
                build_event(
                    execution_id,
                    event.sequence,
                    event.kind,
                    event.payload,
                    event.metadata,
                    event.recorded_at,
                ),
            )
        return self._restore(written, execution_id)

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        stored = self.codec.encode(execution_id)
        if self._closed:
            check_read(execution_id, from_sequence, to_sequence, limit)
            self._refuse_closed()
        try:
            events = await self.inner.read(
                stored, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
            )
        except LoomError as error:
            scrub(error, self.codec, (execution_id,))
            raise
        return self._restore(events, execution_id)

    async def head(self, execution_id: str) -> int:
        stored = self.codec.encode(execution_id)
        with self._errors(execution_id):
            return await self.inner.head(stored)

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        """The tenant's ids in ascending code-point order, strictly after ``after``.

        The tenant's stored ids are one contiguous, order-preserving run of the inner
        order (see :mod:`loom_tenant.codec`): the page starts after the prefix (or after
        the encoded ``after``) and ends at the first id that is not the tenant's.
        """
        cursor = self.codec.prefix if after is None else self.codec.position(after)
        limit = check_limit(limit)
        with self._errors():
            stored = await self.inner.list_executions(after=cursor, limit=limit)
        ids = []
        for candidate in stored:
            raw = self.codec.decode(candidate)
            if raw is None:
                break
            ids.append(raw)
        return tuple(ids)

    async def close(self) -> None:
        """Refuse every later call; close the inner store too if this view owns it."""
        if self._closed:
            return
        self._closed = True
        if self._owns_inner:
            await self.inner.close()

    def _errors(self, *raw_ids: str) -> AbstractContextManager[None]:
        """The scrubbing scope of one call to the inner store, once it is known to be open:
        a closed view refuses even while the store it shares stays open for others."""
        if self._closed:
            self._refuse_closed()
        return tenant_errors(self.codec, *raw_ids)

    def _refuse_closed(self) -> NoReturn:
        raise StoreClosedError(f"tenant {self.tenant!r}'s view of the event store")

    # -- optional: each rewrites ids, so each is our own, offered when the inner offers it

    async def acquire_fence(self, execution_id: str) -> int:
        stored = self.codec.encode(execution_id)
        with self._errors(execution_id):
            return await self.inner.acquire_fence(stored)

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        stored = self.codec.encode(execution_id)
        fence = check_fence(fence)
        park_seq = check_sequence(park_seq, "park_seq")
        with self._errors(execution_id):
            return await self.inner.acquire_fence_if(stored, fence=fence, park_seq=park_seq)

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        stored = self.codec.encode(execution_id)
        if self._closed:
            check_append(execution_id, events, expected_sequence)
            check_fence(observed_fence, "observed_fence")
        with self._errors(execution_id):
            written = await self.inner.append_if_unchanged(
                stored, events, expected_sequence=expected_sequence, observed_fence=observed_fence
            )
        return self._restore(written, execution_id)

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        checked = check_append_requests(requests)
        encoded = [
            dataclasses.replace(request, execution_id=self.codec.encode(request.execution_id))
            for request, _ in checked
        ]
        raw_ids = tuple(request.execution_id for request, _ in checked)
        with self._errors(*raw_ids):
            written = await self.inner.append_many(encoded)
        return tuple(
            self._restore(events, raw) for events, raw in zip(written, raw_ids, strict=True)
        )

    async def delete_execution(self, execution_id: str) -> bool:
        stored = self.codec.encode(execution_id)
        with self._errors(execution_id):
            return await self.inner.delete_execution(stored)

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        stored_source = self.codec.encode(source, "source")
        stored_target = self.codec.encode(target, "target")
        through_sequence = check_sequence(through_sequence, "through_sequence")
        if source == target:
            raise InvalidInputError(f"copy_prefix source and target are both {source!r}")
        with self._errors(source, target):
            return await self.inner.copy_prefix(
                stored_source, stored_target, through_sequence=through_sequence
            )

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        stored = self.codec.encode(execution_id)
        keep_from_sequence = check_sequence(keep_from_sequence, "keep_from_sequence")
        with self._errors(execution_id):
            return await self.inner.truncate_prefix_keeping(
                stored, keep_from_sequence=keep_from_sequence
            )

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        """The tenant's events of ``execution_id``; validated (and opened) eagerly."""
        stored = self.codec.encode(execution_id)
        from_sequence = check_sequence(from_sequence, "from_sequence")
        with self._errors(execution_id):
            events = self.inner.subscribe(stored, from_sequence=from_sequence)
        return self._follow(events, execution_id)

    async def _follow(
        self, events: AsyncIterator[Event], execution_id: str
    ) -> AsyncIterator[Event]:
        try:
            with self._errors(execution_id):
                async for event in events:
                    yield self._restore((event,), execution_id)[0]
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()

    decisions = Decisions(
        acquire_fence=Implement(acquire_fence),
        acquire_fence_if=Implement(acquire_fence_if),
        append_if_unchanged=Implement(append_if_unchanged),
        append_many=Implement(append_many),
        delete_execution=Implement(delete_execution),
        copy_prefix=Implement(copy_prefix),
        truncate_prefix_keeping=Implement(truncate_prefix_keeping),
        subscribe=Implement(subscribe),
    )


def _readdressed(event: Event, execution_id: str) -> Event:
    """``event`` under the tenant's own id (its other fields are the inner store's fresh
    copies, so they are shared, not copied again)."""
    return build_event(
        execution_id, event.sequence, event.kind, event.payload, event.metadata, event.recorded_at
    )
