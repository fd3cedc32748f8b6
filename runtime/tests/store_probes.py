"""Stores for the resume tests: a probe that records (and can interfere with) the calls the
runtime makes, a conditional acquire that ignores the park (a broken store, for negative
controls), a token read that writes nothing, a timer store that forwards every call (for a
test to override one), and apps built over them."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from loom_runtime import Authorize, Context, Loom
from loom_runtime.testing import VirtualClock

from loom_core import (
    Event,
    EventStore,
    FenceNotIssuedError,
    NewEvent,
    Storage,
    TimerRecord,
    TimerStore,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Implement
from loom_core.spi import DEFAULT_LIST_LIMIT, ConditionalFence, OptionalMethod

__all__ = [
    "PROBE_FENCE",
    "ForwardingTimers",
    "ProbedEventStore",
    "StoreCall",
    "TokenOnlyEventStore",
    "Wired",
    "kinds",
    "nap",
    "token_of",
    "wired",
]

PROBE_FENCE: Final = 2**62
"""A token no test reaches: presenting it is refused with the current one, writing nothing."""


async def token_of(events: EventStore, execution_id: str) -> int:
    """The execution's current token, read without writing or taking one."""
    head = await events.head(execution_id)
    try:
        await events.append(
            execution_id, [NewEvent("test.token-probe")], expected_sequence=head,
            fence=PROBE_FENCE,
        )
    except FenceNotIssuedError as refused:
        return refused.current_fence
    raise AssertionError(f"append(fence={PROBE_FENCE}) to {execution_id!r} was accepted")


async def kinds(events: EventStore, execution_id: str) -> list[str]:
    return [e.kind for e in await events.read(execution_id)]


@dataclass(frozen=True, slots=True)
class StoreCall:
    """One acquire or append the runtime made, and what came of it."""

    method: str
    execution_id: str
    fence: int | None = None
    park_seq: int | None = None
    kinds: tuple[str, ...] = ()
    at: int | None = None
    result: object = None
    error: BaseException | None = None


class ProbedEventStore(EventStoreDecorator):
    """Forwards everything; records every acquire and append with its outcome, and awaits
    ``before_acquire(execution_id)`` (when set) before each acquire reaches the store, to
    put a rival or an audit write in the window before the acquire, and
    ``after_append(execution_id, kinds)`` (when set) after an append is written and before
    its caller hears of it, to act in the window a slow reply leaves; ``before_append``
    likewise before an append reaches the store, ``before_read(execution_id)`` before a
    read reaches it, ``after_read(execution_id)`` after a read answered, and
    ``after_list()`` after a ``list_executions`` answered. It counts the reads of each
    stream (``reads``) and the events they returned (``events_read``)."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.calls: list[StoreCall] = []
        self.before_acquire: Callable[[str], Awaitable[None]] | None = None
        self.after_append: Callable[[str, tuple[str, ...]], Awaitable[None]] | None = None
        self.before_append: Callable[[str, tuple[str, ...]], Awaitable[None]] | None = None
        self.after_list: Callable[[], None] | None = None
        self.before_read: Callable[[str], Awaitable[None]] | None = None
        self.after_read: Callable[[str], None] | None = None
        self.reads: Counter[str] = Counter()
        self.events_read: Counter[str] = Counter()

    def of(self, *methods: str) -> list[StoreCall]:
        return [c for c in self.calls if c.method in methods]

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        call = StoreCall(
            "append", execution_id, fence=fence, kinds=tuple(e.kind for e in events),
            at=expected_sequence,
        )
        if self.before_append is not None:
            await self.before_append(execution_id, call.kinds)
        try:
            written = await self.inner.append(
                execution_id, events, expected_sequence=expected_sequence, fence=fence
            )
        except Exception as exc:
            self.calls.append(replace(call, error=exc))
            raise
        self.calls.append(replace(call, result=written))
        if self.after_append is not None:
            await self.after_append(execution_id, call.kinds)
        return written

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        if self.before_read is not None:
            await self.before_read(execution_id)
        got = await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )
        self.reads[execution_id] += 1
        self.events_read[execution_id] += len(got)
        if self.after_read is not None:
            self.after_read(execution_id)
        return got

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        listed = await self.inner.list_executions(after=after, limit=limit)
        if self.after_list is not None:
            self.after_list()
        return listed

    async def acquire_fence(self, execution_id: str) -> int:
        if self.before_acquire is not None:
            await self.before_acquire(execution_id)
        token = await self.inner.acquire_fence(execution_id)
        self.calls.append(StoreCall("acquire_fence", execution_id, result=token))
        return token

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        if self.before_acquire is not None:
            await self.before_acquire(execution_id)
        outcome = await self.inner.acquire_fence_if(execution_id, fence=fence, park_seq=park_seq)
        self.calls.append(
            StoreCall("acquire_fence_if", execution_id, fence=fence, park_seq=park_seq,
                      result=outcome)
        )
        return outcome

    decisions = Decisions(
        acquire_fence=Implement(acquire_fence),
        acquire_fence_if=Implement(acquire_fence_if),
        append_if_unchanged=FORWARD,
        append_many=FORWARD,
        delete_execution=FORWARD,
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=FORWARD,
    )


class TokenOnlyEventStore(EventStoreDecorator):
    """Broken on purpose: its conditional acquire compares the token and ignores the park
    (it asks the store about the newest event, past which nothing can answer), so a rival
    that re-read the token after a resume landed wins and fences the running body out."""

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        newest = await self.inner.head(execution_id) - 1
        return await self.inner.acquire_fence_if(execution_id, fence=fence, park_seq=newest)

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=Implement(acquire_fence_if),
        append_if_unchanged=FORWARD,
        append_many=FORWARD,
        delete_execution=FORWARD,
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=FORWARD,
    )


@dataclass(slots=True)
class Wired:
    """An app over a probed store, with the base storage beneath for direct writes."""

    app: Loom
    probe: ProbedEventStore
    base: Storage
    clock: VirtualClock
    errors: list[BaseException]


async def nap(ctx: Context) -> str:
    """Parks once on a 60 s sleep, then finishes."""
    await ctx.sleep(60)
    return "awake"


@asynccontextmanager
async def wired(
    url: str = "memory://",
    *,
    offer: Sequence[OptionalMethod] | None = None,
    authorize: Authorize | None = None,
    node: str = "n1",
    seed: int = 7,
    timers: Callable[[TimerStore], TimerStore] | None = None,
) -> AsyncIterator[Wired]:
    """An entered app (no background timer service, no recovery on entry: the tests call
    ``poll_once`` and ``recover`` themselves) over ``url`` behind a probe; ``timers``
    wraps the timer store the app is given (the base one stays beneath)."""
    options: dict[str, object] = {} if offer is None else {"offer": tuple(offer)}
    base = await open_storage(url, options=options)
    probe = ProbedEventStore(base.events)
    timer_store = base.timers if timers is None else timers(base.timers)
    storage = Storage(probe, timer_store, base.leases, url=base.url, on_close=base.close)
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(
        storage, node=node, clock=clock, random=random.Random(seed), on_error=errors.append,
        authorize=authorize, timers=False, recover=False,
    )
    app.workflow(name="nap")(nap)
    try:
        async with app:
            yield Wired(app, probe, base, clock, errors)
    finally:
        await storage.close()


class ForwardingTimers:
    """A timer store that forwards every call to ``inner``: a test subclasses it to count
    or hold the one call it is about."""

    def __init__(self, inner: TimerStore) -> None:
        self.inner = inner

    async def schedule(self, record: TimerRecord) -> None:
        await self.inner.schedule(record)

    async def due(
        self, now: datetime, *, limit: int = DEFAULT_LIST_LIMIT, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        return await self.inner.due(now, limit=limit, redrive=redrive)

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        return await self.inner.pending(execution_id)

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        return await self.inner.complete(execution_id, wake_at)

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        return await self.inner.cancel(execution_id, wake_at)

    async def close(self) -> None:
        await self.inner.close()
