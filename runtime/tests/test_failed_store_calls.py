"""A run whose store call fails (the database down longer than its driver retries, a write
whose outcome was lost with its connection) is carried on by the app that drove it once
the store answers again, as a restarted node would carry it on; a failure of the store is
never the body's to see.

The store here fails on demand: ``down`` makes every call to it raise
StorageUnavailableError (nothing done); ``unknown`` makes the next append of a kind land
and then raise WriteOutcomeUnknownError, as a connection lost after the commit was sent
does. Time is the app's virtual clock, moved by the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime

import pytest
from loom_runtime import Context, Handle, LogFormatError, Loom, records
from loom_runtime.app import CARRY_ON_AFTER, CARRY_ON_CAP
from loom_runtime.testing import VirtualClock
from store_probes import kinds

from loom_core import (
    Event,
    EventKind,
    EventStore,
    NewEvent,
    Storage,
    StorageUnavailableError,
    TimerRecord,
    TimerStore,
    WriteOutcomeUnknownError,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Implement
from loom_core.spi import ConditionalFence


@dataclass
class Switch:
    """What the failing stores do: everything fails while ``down``; the next append that
    writes a kind in ``unknown`` lands, then fails as if its reply were lost."""

    down: bool = False
    unknown: set[str] = field(default_factory=set)
    unreadable: set[str] = field(default_factory=set)
    """Streams whose reads find a log the runtime cannot read (not a store failure)."""
    refused: set[str] = field(default_factory=set)
    """Kinds whose appends fail (nothing written) while listed: a store that takes a
    small write but not the next one."""
    refused_in: set[str] = field(default_factory=set)
    """The executions ``refused`` applies to (every one when empty)."""
    before_acquire: Callable[[str], Awaitable[None]] | None = None
    """Awaited, once, before the next ``acquire_fence`` reaches the store."""
    lose_acquire_if: bool = False
    """The next ``acquire_fence_if`` never reaches the store, and its caller is told its
    outcome is unknown."""
    tripped: bool = False

    def trip(self) -> None:
        """Go down, the first time only (a body or a step run again must not)."""
        if not self.tripped:
            self.tripped = self.down = True

    def check(self, what: str) -> None:
        if self.down:
            raise StorageUnavailableError(f"{what}: the test's store is down")


class FailingEventStore(EventStoreDecorator):
    def __init__(self, inner: EventStore, switch: Switch) -> None:
        super().__init__(inner)
        self.switch = switch

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        self.switch.check(f"append to {execution_id!r}")
        if self.switch.refused & {e.kind for e in events} and (
            not self.switch.refused_in or execution_id in self.switch.refused_in
        ):
            raise StorageUnavailableError(f"append to {execution_id!r}: the test refused it")
        written = await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )
        lost = self.switch.unknown & {e.kind for e in events}
        if lost:
            self.switch.unknown -= lost
            raise WriteOutcomeUnknownError("append", execution_id, "the test lost the reply")
        return written

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        self.switch.check(f"read of {execution_id!r}")
        if execution_id in self.switch.unreadable:
            raise LogFormatError(execution_id, 0, "MESSAGE", "the test made it unreadable")
        return await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )

    async def acquire_fence(self, execution_id: str) -> int:
        self.switch.check(f"acquire_fence on {execution_id!r}")
        before, self.switch.before_acquire = self.switch.before_acquire, None
        if before is not None:
            await before(execution_id)
        return await self.inner.acquire_fence(execution_id)

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        self.switch.check(f"acquire_fence_if on {execution_id!r}")
        if self.switch.lose_acquire_if:
            self.switch.lose_acquire_if = False
            raise WriteOutcomeUnknownError("acquire_fence_if", execution_id, "the test lost it")
        return await self.inner.acquire_fence_if(execution_id, fence=fence, park_seq=park_seq)

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


class FailingTimerStore:
    def __init__(self, inner: TimerStore, switch: Switch) -> None:
        self.inner = inner
        self.switch = switch

    async def schedule(self, record: TimerRecord) -> None:
        self.switch.check(f"schedule on {record.execution_id!r}")
        await self.inner.schedule(record)

    async def due(
        self, now: datetime, *, limit: int = 100, redrive: bool = False
    ) -> tuple[TimerRecord, ...]:
        self.switch.check("due")
        return await self.inner.due(now, limit=limit, redrive=redrive)

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        self.switch.check(f"pending of {execution_id!r}")
        return await self.inner.pending(execution_id)

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        self.switch.check(f"complete on {execution_id!r}")
        return await self.inner.complete(execution_id, wake_at)

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        self.switch.check(f"cancel on {execution_id!r}")
        return await self.inner.cancel(execution_id, wake_at)

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Failing:
    app: Loom
    switch: Switch
    base: Storage
    clock: VirtualClock
    storage_errors: list[tuple[str, BaseException]]
    errors: list[BaseException]
    heard: list[Event]
    """What ``on_durable_event`` was told, in order."""

    async def wait_out(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` and let what woke run to its end or park."""
        # One turn of the loop first: a carry-on task made since the last turn starts its
        # wait on the clock (tasks run in the order they were made), so the move wakes it.
        await asyncio.sleep(0)
        await self.clock.advance(seconds)
        await self.app.drain()


@asynccontextmanager
async def failing() -> AsyncIterator[Failing]:
    base = await open_storage("memory://")
    switch = Switch()
    storage = Storage(
        FailingEventStore(base.events, switch),
        FailingTimerStore(base.timers, switch),
        base.leases,
        url=base.url,
        on_close=base.close,
    )
    clock = VirtualClock()
    storage_errors: list[tuple[str, BaseException]] = []
    errors: list[BaseException] = []
    heard: list[Event] = []
    app = Loom(
        storage, node="n1", clock=clock, random=random.Random(7), timers=False, recover=False,
        on_error=errors.append, on_durable_event=heard.append,
        on_storage_error=lambda execution_id, exc: storage_errors.append((execution_id, exc)),
    )
    try:
        async with app:
            yield Failing(app, switch, base, clock, storage_errors, errors, heard)
    finally:
        await storage.close()


async def parked_listener(app: Loom) -> Handle[object]:
    """Execution ``l``, parked on a receive of ``go`` with a ten-minute timeout."""

    @app.workflow(name="listen")
    async def listen(ctx: Context) -> object:
        return await ctx.receive("go", timeout=600)

    handle = await app.start(listen, id="l")
    await app.drain()
    assert await handle.status() == "suspended"
    return handle


async def test_a_run_whose_write_failed_is_carried_on_once_the_store_answers() -> None:
    async with failing() as f:
        ran: list[str] = []

        async def charge() -> str:
            ran.append("charge")
            f.switch.trip()  # the store goes down while the step runs
            return "charged"

        @f.app.workflow()
        async def order(ctx: Context) -> str:
            return await ctx.step(charge)

        handle = await f.app.start(order, id="o")
        await f.app.drain()
        assert [e for e, _ in f.storage_errors] == ["o"]
        assert f.app.stranded == {"o"}
        await f.wait_out(CARRY_ON_AFTER)  # still down: it waits twice as long next time
        assert f.app.stranded == {"o"}
        assert [e for e, _ in f.storage_errors] == ["o", "o"]
        f.switch.down = False
        await f.wait_out(CARRY_ON_AFTER * 2)
        assert await handle.result(timeout=5) == "charged"
        assert f.app.stranded == frozenset()
        assert ran == ["charge", "charge"]  # its record was lost with the write: at least once
        assert await kinds(f.base.events, "o") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_RECOVERED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert f.errors == []  # on_storage_error heard of it; on_error is for what has no caller


async def test_the_wait_between_tries_doubles_up_to_its_cap() -> None:
    async with failing() as f:

        @f.app.workflow()
        async def order(ctx: Context) -> str:
            f.switch.trip()
            return await ctx.step(lambda: "x", name="x")

        await f.app.start(order, id="o")
        await f.app.drain()
        tries = [len(f.storage_errors)]
        waited = 0.0
        while waited < 200:
            await f.wait_out(CARRY_ON_CAP / 2)
            waited += CARRY_ON_CAP / 2
            tries.append(len(f.storage_errors))
        # Once the cap is reached, at most one try per cap's worth of time, at least one
        # per cap (each wait is drawn between half the cap and the cap).
        late = tries[-1] - tries[len(tries) // 2]
        span = (len(tries) - 1 - len(tries) // 2) * CARRY_ON_CAP / 2
        assert span / CARRY_ON_CAP - 1 <= late <= span / (CARRY_ON_CAP / 2)
        f.switch.down = False
        await f.wait_out(CARRY_ON_CAP)
        assert await f.app.get("o").result(timeout=5) == "x"


async def test_a_failed_timer_row_stops_the_run_before_its_park_and_it_parks_later() -> None:
    async with failing() as f:

        @f.app.workflow()
        async def nap(ctx: Context) -> str:
            f.switch.trip()  # the timer row's write fails
            await ctx.sleep(3600)
            return "awake"

        handle = await f.app.start(nap, id="n")
        await f.app.drain()
        assert [e for e, _ in f.storage_errors] == ["n"]
        assert "schedule" in str(f.storage_errors[0][1])
        assert await kinds(f.base.events, "n") == [EventKind.EXECUTION_STARTED]
        f.switch.down = False
        await f.wait_out(CARRY_ON_AFTER)
        assert await handle.status() == "suspended"
        assert [r.execution_id for r in await f.base.timers.pending("n")] == ["n"]
        await f.wait_out(3600)
        await f.app.timer_service.poll_once()
        await f.app.drain()
        assert await handle.result(timeout=5) == "awake"


async def test_a_failed_inbox_read_is_not_the_bodys_to_catch() -> None:
    async with failing() as f:
        caught: list[BaseException] = []

        @f.app.workflow()
        async def listen(ctx: Context) -> object:
            f.switch.trip()  # the receive's look into the inbox fails
            try:
                return await ctx.receive("go", timeout=600)
            except Exception as exc:
                caught.append(exc)
                return "swallowed"

        handle = await f.app.start(listen, id="l")
        await f.app.drain()
        assert caught == []
        assert [e for e, _ in f.storage_errors] == ["l"]
        f.switch.down = False
        await f.app.send("l", "go", {"n": 1})
        await f.wait_out(CARRY_ON_AFTER)
        assert await handle.result(timeout=5) == {"n": 1}
        assert caught == []
        assert (await kinds(f.base.events, "l")).count(EventKind.MESSAGE_CONSUMED) == 1


async def test_a_start_whose_write_landed_unheard_is_carried_on() -> None:
    async with failing() as f:

        @f.app.workflow()
        async def order(ctx: Context) -> str:
            return "done"

        f.switch.unknown = {EventKind.EXECUTION_STARTED}
        with pytest.raises(WriteOutcomeUnknownError):
            await f.app.start(order, id="o")
        assert f.app.stranded == {"o"}
        await f.wait_out(CARRY_ON_AFTER)
        assert await f.app.get("o").result(timeout=5) == "done"
        assert await kinds(f.base.events, "o") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_RECOVERED,
            EventKind.EXECUTION_COMPLETED,
        ]


async def test_an_answer_that_landed_unheard_leaves_the_receiver_carried_on() -> None:
    async with failing() as f:
        handle = await parked_listener(f.app)
        f.switch.unknown = {EventKind.EXECUTION_RESUMED}
        # The message is stored: send returns its id (a caller that sent it again without
        # a key would have it twice), and on_storage_error hears of the delivery's fate.
        assert await f.app.send("l", "go", {"n": 1}) == 0
        assert [type(e) for _, e in f.storage_errors] == [WriteOutcomeUnknownError]
        assert f.app.stranded == {"l"}
        await f.wait_out(CARRY_ON_AFTER)
        assert await handle.result(timeout=5) == {"n": 1}
        log = await kinds(f.base.events, "l")
        assert log.count(EventKind.MESSAGE_CONSUMED) == 1
        assert log.count(EventKind.EXECUTION_RESUMED) == 1


async def test_a_start_refused_for_good_strands_nothing() -> None:
    async with failing() as f:

        @f.app.workflow()
        async def order(ctx: Context) -> str:
            return "done"

        f.switch.down = True  # nothing is written: the caller is told, and that is all
        with pytest.raises(StorageUnavailableError):
            await f.app.start(order, id="o")
        assert f.app.stranded == frozenset()
        f.switch.down = False
        assert await f.base.events.head("o") == 0


async def test_leaving_with_runs_not_carried_on_yet_names_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with failing() as f:

        @f.app.workflow()
        async def order(ctx: Context) -> str:
            f.switch.trip()
            return await ctx.step(lambda: "x", name="x")

        await f.app.start(order, id="o")
        await f.app.drain()
        assert f.app.stranded == {"o"}
        caplog.set_level(logging.WARNING, logger="loom_runtime")
    (record,) = [r for r in caplog.records if r.name == "loom_runtime"]
    assert "1 running execution(s) of node 'n1'" in record.getMessage()
    assert "'o'" in record.getMessage()


async def test_a_run_carried_on_that_stops_again_before_writing_waits_longer_each_time() -> None:
    """A store that takes the takeover's small write but not the step's result: each
    carry-on waits twice as long as the one before, and none counts as a recovery (the
    process never died), so the node's next start carries the execution on rather than
    failing it for its recovery limit."""
    async with failing() as f:
        ran: list[str] = []

        def charge() -> str:
            ran.append("charge")
            return "charged"

        @f.app.workflow(name="order", max_recoveries=1)
        async def order(ctx: Context) -> str:
            return await ctx.step(charge)

        f.switch.refused = {EventKind.STEP_COMPLETED}
        await f.app.start(order, id="o")
        await f.app.drain()
        assert f.app.stranded == {"o"}
        for _ in range(600):  # ten minutes, a second at a time
            await f.wait_out(1)
        view = await f.app.inspect("o")
        # Waits of 1, 2, 4, ... up to 30 s, each drawn from half to all of it: at most
        # 1 + 2 + 4 + 8 + 16 + 31 in ten minutes, where a wait that did not grow would
        # have taken it back at least 600 times.
        assert 6 <= view.carried_on <= 6 + 31
        assert len(ran) == view.carried_on + 1
        assert view.recoveries == 0
        assert view.status == "running"

        f.switch.refused = set()
        restarted = Loom(f.base, node="n1", clock=f.clock, timers=False, recover=False)
        restarted.workflow(name="order", max_recoveries=1)(order)
        async with restarted:
            (handle,) = await restarted.recover()
            assert await handle.result(timeout=5) == "charged"


async def test_a_carry_on_leaves_the_run_of_a_node_that_answered_the_park_that_landed() -> None:
    """Node n1's park write lands unheard; before n1 carries the execution on, node n2
    answers the park and drives the body into a step. n1's carry-on looks first: the log
    holds a write where n1's was to go, so that write has landed or never will, and n1
    takes no token: n2's run goes on, and its step runs once."""
    async with failing() as f:
        entered = asyncio.Event()
        gate = asyncio.Event()
        runs: list[str] = []

        async def work(node: str) -> str:
            runs.append(node)
            if node == "n2":
                entered.set()
                await gate.wait()
            return node

        def body(node: str) -> Callable[[Context], Awaitable[str]]:
            async def nap(ctx: Context) -> str:
                await ctx.sleep(3600)
                return await ctx.step(work, node, name="work")

            return nap

        f.app.workflow(name="nap")(body("n1"))
        f.switch.unknown = {EventKind.EXECUTION_SUSPENDED}
        await f.app.start("nap", id="z")
        await f.app.drain()
        assert f.app.stranded == {"z"}
        other = Loom(f.base, node="n2", timers=False, recover=False)
        other.workflow(name="nap")(body("n2"))
        async with other:
            view = await other.inspect("z")
            assert view.park is not None
            await other.resume("z", fence_if_parked_at=view.park.sequence)
            await entered.wait()
            await f.wait_out(CARRY_ON_AFTER)
            assert f.app.stranded == frozenset()
            gate.set()
            assert await other.get("z").result(timeout=5) == "n2"
        assert runs == ["n2"]
        assert [e.kind for e in await f.base.events.read("z")] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_RESUMED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_COMPLETED,
        ]


async def test_a_carry_on_that_fenced_out_another_nodes_run_drives_the_execution_itself() -> None:
    """Node n1's resume loses the reply of its conditional acquire; n1's carry-on looks
    and finds the park still open, and node n2 answers it and drives the body into a step
    just before n1's token. That token fences n2's run out: n1 then drives the execution
    itself, though the log names n2, rather than leaving it running with no driver."""
    async with failing() as f:
        entered = asyncio.Event()
        gate = asyncio.Event()
        runs: list[str] = []

        async def work(node: str) -> str:
            runs.append(node)
            if node == "n2":
                entered.set()
                await gate.wait()
            return node

        def body(node: str) -> Callable[[Context], Awaitable[str]]:
            async def nap(ctx: Context) -> str:
                await ctx.sleep(3600)
                return await ctx.step(work, node, name="work")

            return nap

        f.app.workflow(name="nap")(body("n1"))
        await f.app.start("nap", id="z")
        await f.app.drain()
        view = await f.app.inspect("z")
        assert view.park is not None
        park = view.park.sequence
        f.switch.lose_acquire_if = True
        with pytest.raises(WriteOutcomeUnknownError):
            await f.app.resume("z", fence_if_parked_at=park)
        assert f.app.stranded == {"z"}
        other = Loom(f.base, node="n2", timers=False, recover=False)
        other.workflow(name="nap")(body("n2"))
        async with other:

            async def answered_meanwhile(execution_id: str) -> None:
                await other.resume(execution_id, fence_if_parked_at=park)
                await entered.wait()

            f.switch.before_acquire = answered_meanwhile
            await f.wait_out(CARRY_ON_AFTER)
            gate.set()
            await other.drain()
        assert await f.app.get("z").result(timeout=5) == "n1"
        assert runs == ["n2", "n1"]
        log = await f.base.events.read("z")
        recovered = [e.payload for e in log if e.kind == EventKind.EXECUTION_RECOVERED]
        assert [(p["node"], p["carried_on"]) for p in recovered if isinstance(p, dict)] == [
            ("n1", True)
        ]
        assert [e.kind for e in log][-2:] == [
            EventKind.STEP_COMPLETED, EventKind.EXECUTION_COMPLETED
        ]


async def test_a_send_whose_delivery_fails_returns_and_the_message_is_delivered_later() -> None:
    """The store fails after the message is stored, before the receiver is answered:
    send returns the message's id all the same, and the wake row it wrote first delivers
    the message once the store answers."""
    async with failing() as f:
        handle = await parked_listener(f.app)
        real_acquire = f.base.events.acquire_fence_if

        async def trip_then_acquire(
            execution_id: str, *, fence: int, park_seq: int
        ) -> ConditionalFence:
            f.switch.trip()  # the message is stored; the store goes before the answer
            return await real_acquire(execution_id, fence=fence, park_seq=park_seq)

        f.base.events.acquire_fence_if = trip_then_acquire  # type: ignore[method-assign]
        assert await f.app.send("l", "go", {"n": 1}) == 0
        assert {e for e, _ in f.storage_errors} == {"l"}  # the answer, the row written again
        f.switch.down = False
        assert await handle.status() == "suspended"
        await f.clock.advance(1)
        await f.app.timer_service.poll_once()
        await f.app.drain()
        assert await handle.result(timeout=5) == {"n": 1}
        assert (await kinds(f.base.events, "l")).count(EventKind.MESSAGE_CONSUMED) == 1
        assert f.errors == []


async def test_a_nodes_recovery_cut_short_by_the_store_still_counts_against_the_limit() -> None:
    """A restart whose recovery of an execution fails on the store strands it, and the
    background retry is that recovery made again: counted, so a crash-looping execution
    at its limit is failed, not run again (and not written down as a live carry-on)."""
    async with failing() as f:
        ran: list[str] = []

        async def poison() -> str:
            ran.append("poison")
            return "never recorded"

        @f.app.workflow(name="poisoned", max_recoveries=1)
        async def poisoned(ctx: Context) -> str:
            return await ctx.step(poison)

        fingerprint = f.app._code_digest("poisoned")
        await f.base.events.append(
            "p",
            [
                records.started("poisoned", [], fingerprint=fingerprint, node="n1", root="p"),
                records.recovered("n1", 1, fingerprint),  # the last start's, which died
            ],
            expected_sequence=0,
        )
        f.switch.down = True  # reads fail; the listing still answers
        assert await f.app.recover() == []
        assert f.app.stranded == {"p"}
        f.switch.down = False
        await f.wait_out(CARRY_ON_AFTER)
        view = await f.app.inspect("p")
        assert view.status == "failed"
        assert view.error is not None
        assert view.error[0].endswith("RecoveryLimitError")
        assert ran == []


async def test_a_run_stopped_by_a_log_it_cannot_read_is_reported_and_not_carried_on() -> None:
    """Not a store failure: waiting for the store to answer would change nothing, so the
    run's stop goes to on_error (an operator's), and the execution is not stranded."""
    async with failing() as f:

        @f.app.workflow()
        async def listen(ctx: Context) -> object:
            return await ctx.receive("go", timeout=600)

        f.switch.unreadable = {"$inbox:l"}
        await f.app.start(listen, id="l")
        await f.app.drain()
        assert [type(e) for e in f.errors] == [LogFormatError]
        assert f.app.stranded == frozenset()


async def test_a_timer_cleanup_that_fails_after_the_end_strands_nothing() -> None:
    async with failing() as f:

        @f.app.workflow()
        async def nap(ctx: Context) -> str:
            await ctx.sleep(0)
            return "rested"

        async def cannot_cancel(execution_id: str, wake_at: datetime | None = None) -> int:
            raise StorageUnavailableError(f"cancel on {execution_id!r}: the test's disk is full")

        f.base.timers.cancel = cannot_cancel  # type: ignore[method-assign]
        assert await f.app.execute(nap, id="n") == "rested"
        await f.app.drain()
        assert [e for e, _ in f.storage_errors] == ["n"]
        assert f.errors == []
        assert f.app.stranded == frozenset()


async def test_an_execution_whose_carry_ons_keep_failing_holds_back_no_other() -> None:
    """One execution's step result is refused at every carry-on, so it waits longer and
    longer; another, stranded once meanwhile, is carried on a second or so later, not
    when the first one's next try comes."""
    async with failing() as f:

        @f.app.workflow(name="order")
        async def order(ctx: Context, n: int) -> int:
            return await ctx.step(lambda: n, name="charge")

        f.switch.refused, f.switch.refused_in = {EventKind.STEP_COMPLETED}, {"a"}
        await f.app.start(order, 1, id="a")
        await f.app.drain()
        for _ in range(40):  # a few carry-ons: a's next wait is 8 s or more
            await f.wait_out(1)
        assert (await f.app.inspect("a")).carried_on >= 3

        @f.app.workflow(name="pair")
        async def pair(ctx: Context) -> list[int]:
            return [await ctx.step(lambda: 1, name="one"), await ctx.step(lambda: 2, name="two")]

        f.switch.unknown = {EventKind.STEP_COMPLETED}  # b's first result lands, unheard
        handle = await f.app.start(pair, id="b")
        await f.app.drain()
        assert f.app.stranded == {"a", "b"}
        assert await handle.status() == "running"
        await f.wait_out(CARRY_ON_AFTER)
        assert await handle.status() == "completed"
        assert await handle.result(timeout=5) == [1, 2]
        assert f.app.stranded == {"a"}


@pytest.mark.parametrize(
    "lost",
    [
        EventKind.EXECUTION_STARTED,  # a start's first write
        EventKind.STEP_COMPLETED,  # a run's own write
        EventKind.EXECUTION_COMPLETED,  # a run's last write: nothing runs after it
        EventKind.EXECUTION_RESUMED,  # an answer a send wrote, with its MESSAGE_CONSUMED
    ],
)
async def test_a_write_that_landed_unheard_is_reported_to_on_durable_event_once(
    lost: str,
) -> None:
    """A write whose reply was lost, in a process that lives on: once the take-back
    settles the log, on_durable_event hears of each event the write put there, once, as
    of every other event of the log."""
    async with failing() as f:

        @f.app.workflow()
        async def order(ctx: Context) -> object:
            await ctx.step(lambda: 1, name="charge")
            return await ctx.receive("go")

        f.switch.unknown = {lost}
        with contextlib.suppress(WriteOutcomeUnknownError):
            await f.app.start(order, id="o")
        await f.app.drain()
        await f.wait_out(CARRY_ON_AFTER)
        await f.app.send("o", "go", 1)
        await f.app.drain()
        await f.wait_out(CARRY_ON_AFTER)
        assert await f.app.get("o").result(timeout=5) == 1
        assert not f.switch.unknown  # the reply was lost
        log = await f.base.events.read("o")
        assert lost in [e.kind for e in log]
        assert sorted(f.heard, key=lambda e: e.sequence) == list(log)


@pytest.mark.parametrize("hook", [True, False], ids=["with-on_durable_event", "without"])
async def test_a_cancel_whose_answer_landed_unheard_is_reported_and_returns_true(
    hook: bool,
) -> None:
    """Whether the cancel cancelled does not depend on whether anyone listens."""
    async with failing() as f:
        if not hook:
            f.app.hooks.on_durable_event = None
        await parked_listener(f.app)
        f.switch.unknown = {EventKind.EXECUTION_CANCELLED}
        assert await f.app.cancel("l", reason="done with it")
        log = await f.base.events.read("l")
        assert [e.kind for e in log][-1] == EventKind.EXECUTION_CANCELLED
        assert f.heard == (list(log) if hook else [])
        assert await f.base.timers.pending("l") == ()  # its timeout's row went with it


async def test_with_no_on_storage_error_an_outage_is_logged_once_and_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No on_storage_error given: the store failure that stops runs is not lost, it is
    logged at WARNING, once for the outage however many runs it stops and however many
    carry-on tries it fails (the others at DEBUG), and once at INFO when a run is carried
    on again."""
    base = await open_storage("memory://")
    switch = Switch()
    storage = Storage(
        FailingEventStore(base.events, switch),
        FailingTimerStore(base.timers, switch),
        base.leases,
        url=base.url,
        on_close=base.close,
    )
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n1", clock=clock, random=random.Random(7), timers=False,
               recover=False, on_error=errors.append)
    caplog.set_level(logging.DEBUG, logger="loom_runtime")

    async def charge() -> str:
        switch.trip()  # the store goes down while the steps run
        return "charged"

    @app.workflow()
    async def order(ctx: Context) -> str:
        return await ctx.step(charge)

    try:
        async with app:
            handles = [await app.start(order, id=f"o{i}") for i in range(3)]
            await app.drain()
            assert app.stranded == {"o0", "o1", "o2"}
            for _ in range(120):  # an hour of carry-on tries
                await asyncio.sleep(0)
                await clock.advance(CARRY_ON_CAP)
                await app.drain()
            assert app.stranded == {"o0", "o1", "o2"}
            warned = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warned) == 1
            assert "a store call failed under o0" in warned[0].getMessage()
            assert warned[0].execution_id == "o0"  # type: ignore[attr-defined]
            assert len([r for r in caplog.records if r.levelno == logging.DEBUG
                        and "a store call failed again" in r.getMessage()]) > 100
            assert not [r for r in caplog.records if r.levelno == logging.INFO]
            switch.down = False
            for _ in range(3):
                await asyncio.sleep(0)
                await clock.advance(CARRY_ON_CAP)
                await app.drain()
            assert [await h.result(timeout=5) for h in handles] == ["charged"] * 3
            back = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
            assert len(back) == 1
            assert back[0].startswith("the store answers again")
    finally:
        await storage.close()
    assert errors == []


async def test_with_no_on_storage_error_an_outage_at_the_next_entry_is_logged_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The app is left while a store failure keeps its runs stopped, and entered again:
    that entry's first store failure under a run is logged at WARNING, as the first
    entry's was, rather than at DEBUG as a repeat of an outage the app was left in."""
    base = await open_storage("memory://")
    switch = Switch()
    storage = Storage(
        FailingEventStore(base.events, switch),
        FailingTimerStore(base.timers, switch),
        base.leases,
        url=base.url,
        on_close=base.close,
    )
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n1", clock=clock, random=random.Random(7), timers=False,
               recover=False, on_error=errors.append)
    caplog.set_level(logging.DEBUG, logger="loom_runtime")

    async def charge() -> str:
        switch.down = True  # the store goes down while the step runs, at every entry
        return "charged"

    @app.workflow()
    async def order(ctx: Context) -> str:
        return await ctx.step(charge)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and r.getMessage().startswith("a store call failed")]

    try:
        async with app:
            await app.start(order, id="o1")
            await app.drain()
            assert app.stranded == {"o1"}
        assert len(warned()) == 1
        switch.down = False
        async with app:
            await app.start(order, id="o2")
            await app.drain()
            assert "o2" in app.stranded
        assert len(warned()) == 2
        assert "under o2" in warned()[1]
    finally:
        await storage.close()


async def test_with_no_on_storage_error_a_store_that_takes_only_the_take_back_is_one_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that takes each carry-on's small write but fails the step's result: the
    run stops again at every try. With no on_storage_error, that is one WARNING for as
    long as it lasts, not a WARNING and an INFO ("the store answers again") at each try;
    the INFO comes once a run's write goes through."""
    base = await open_storage("memory://")
    switch = Switch(refused={EventKind.STEP_COMPLETED})
    storage = Storage(
        FailingEventStore(base.events, switch),
        FailingTimerStore(base.timers, switch),
        base.leases,
        url=base.url,
        on_close=base.close,
    )
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n1", clock=clock, random=random.Random(7), timers=False,
               recover=False, on_error=errors.append)
    caplog.set_level(logging.DEBUG, logger="loom_runtime")
    tries: list[int] = []

    async def charge() -> str:
        tries.append(1)
        return "charged"

    @app.workflow()
    async def order(ctx: Context) -> str:
        return await ctx.step(charge)

    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level]

    try:
        async with app:
            handle = await app.start(order, id="o1")
            await app.drain()
            for _ in range(60):  # half an hour of carry-on tries
                await asyncio.sleep(0)
                await clock.advance(CARRY_ON_CAP)
                await app.drain()
            assert len(tries) > 10  # carried on, and stopped again, many times
            assert app.stranded == {"o1"}
            assert len(said(logging.WARNING)) == 1
            assert said(logging.INFO) == []
            switch.refused.clear()
            for _ in range(3):
                await asyncio.sleep(0)
                await clock.advance(CARRY_ON_CAP)
                await app.drain()
            assert await handle.result(timeout=5) == "charged"
            back = said(logging.INFO)
            assert len(back) == 1
            assert back[0].startswith("the store answers again")
    finally:
        await storage.close()
    assert errors == []


async def test_with_no_on_storage_error_a_failure_that_stopped_no_run_does_not_hide_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A message's delivery that the store fails (the message waits for the timer
    service) stops no run, so no carry-on ends it. A run's write that goes through ends
    it, and a later outage that stops runs is logged at WARNING again, not taken for
    more of the first."""
    base = await open_storage("memory://")
    switch = Switch()
    storage = Storage(
        FailingEventStore(base.events, switch),
        FailingTimerStore(base.timers, switch),
        base.leases,
        url=base.url,
        on_close=base.close,
    )
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n1", clock=clock, random=random.Random(7), timers=False,
               recover=False, on_error=errors.append)
    caplog.set_level(logging.DEBUG, logger="loom_runtime")

    @app.workflow()
    async def inbox(ctx: Context) -> object:
        return await ctx.receive("t")

    async def charge(down: bool) -> str:
        if down:
            switch.trip()
        return "charged"

    @app.workflow()
    async def order(ctx: Context, down: bool) -> str:
        return await ctx.step(charge, down)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    try:
        async with app:
            await app.start(inbox, id="r")
            await app.drain()
            switch.refused = {EventKind.EXECUTION_RESUMED}
            await app.send("r", "t", 1)  # stored; its delivery fails
            assert len(warned()) == 1
            assert app.stranded == frozenset()
            switch.refused = set()
            assert await app.execute(order, False, id="o1") == "charged"
            await app.start(order, True, id="o2")  # the store goes down under it
            await app.drain()
            assert app.stranded == {"o2"}
            assert len(warned()) == 2
            assert "under o2" in warned()[1]
    finally:
        await storage.close()
