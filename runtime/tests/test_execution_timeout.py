"""``execution_timeout=`` on ``app.start`` / ``app.execute``: a deadline in the log, a
timer row that cancels the execution when it passes, and the error its result raises."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta

import pytest
from loom_runtime import (
    Context,
    ExecutionCancelledError,
    ExecutionTimedOutError,
    InvalidDurationError,
    Loom,
)
from loom_runtime.testing import VirtualClock, crash_at

from loom_core import EventKind, ExecutionAlreadyExistsError, TimerRecord, open_storage

START = datetime(2030, 1, 1, tzinfo=UTC)  # where a VirtualClock starts


async def kinds(app: Loom, execution_id: str) -> list[str]:
    return [str(e.kind) for e in await app.storage.events.read(execution_id)]


class Busy:
    """A workflow whose first step runs until the test releases it; ``after`` records
    whether the step after it ran."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.after: list[str] = []

    async def slow(self) -> str:
        self.entered.set()
        await self.release.wait()
        return "late"

    def next_step(self) -> None:
        self.after.append("ran")

    async def body(self, ctx: Context) -> str:
        await ctx.step(self.slow, name="slow")
        await ctx.step(self.next_step, name="next_step")
        return "finished"


async def rows(app: Loom, execution_id: str) -> list[float]:
    """The instants of the execution's timer rows, as seconds after the virtual clock's
    start (every test here starts its execution there)."""
    return [
        (row.wake_at - START).total_seconds()
        for row in await app.storage.timers.pending(execution_id)
    ]


async def test_a_parked_execution_is_cancelled_when_its_deadline_passes(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def approval(ctx: Context) -> object:
        return await ctx.receive("approved")

    handle = await app.start(approval, id="a", execution_timeout=60)
    await clock.advance(0)
    view = await app.inspect("a")
    assert view.status == "suspended"
    assert view.deadline == START + timedelta(seconds=60)
    assert await rows(app, "a") == [60.0]

    await clock.advance(59)
    assert await handle.status() == "suspended"
    await clock.advance(1)
    assert await handle.status() == "cancelled"
    with pytest.raises(ExecutionTimedOutError) as caught:
        await handle.result(timeout=5)
    assert isinstance(caught.value, ExecutionCancelledError)  # caught as any cancel too
    assert "execution_timeout" in str(caught.value)
    view = await app.inspect("a")
    assert view.timed_out
    assert view.cancel_reason == "its execution_timeout passed"
    assert await kinds(app, "a") == [
        EventKind.EXECUTION_STARTED,
        EventKind.EXECUTION_SUSPENDED,
        EventKind.EXECUTION_CANCELLED,
    ]
    assert await app.storage.timers.pending("a") == ()
    # A message sent after the cancel does not bring it back.
    await app.send("a", "approved", True)
    await clock.advance(0)
    assert await handle.status() == "cancelled"


async def test_an_execution_that_ends_in_time_keeps_its_result_and_leaves_no_row(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def quick(ctx: Context) -> str:
        await ctx.sleep(10)
        return "done"

    handle = await app.start(quick, id="q", execution_timeout=timedelta(minutes=1))
    await clock.advance(0)
    assert sorted(await rows(app, "q")) == [10.0, 60.0]
    await clock.advance(10)
    assert await handle.result(timeout=5) == "done"
    assert await app.storage.timers.pending("q") == ()
    await clock.advance(120)
    assert await handle.status() == "completed"
    assert not (await app.inspect("q")).timed_out


async def test_a_sleep_past_the_deadline_ends_at_the_deadline(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def long_nap(ctx: Context) -> str:
        await ctx.sleep(3600)
        return "rested"

    handle = await app.start(long_nap, id="n", execution_timeout=30)
    await clock.advance(30)
    with pytest.raises(ExecutionTimedOutError):
        await handle.result(timeout=5)
    assert await app.storage.timers.pending("n") == ()


async def test_a_running_execution_is_stopped_at_its_deadline() -> None:
    """A step still running at the deadline, on node a; node b's timer service fires the
    deadline row: the execution is cancelled under a fresh fence, node a's run stops at
    its next write, and the calls after the step never happen."""
    clock = VirtualClock()
    busy = Busy()
    async with open_storage("memory://") as storage:
        a = Loom(storage, node="a", clock=clock, timers=False, recover=False)
        b = Loom(storage, node="b", clock=clock, timers=False, recover=False)
        a.workflow(name="busy")(busy.body)
        b.workflow(name="busy")(busy.body)
        async with a, b:
            handle = await a.start(busy.body, id="b", execution_timeout=5)
            await busy.entered.wait()
            await clock.advance(5)  # moves the time only: no timer service is on the clock
            assert list((await b.timer_service.poll_once()).values()) == ["timed-out"]
            assert await handle.status() == "cancelled"
            busy.release.set()
            await a.drain()
            assert busy.after == []
            with pytest.raises(ExecutionTimedOutError):
                await handle.result(timeout=5)
            assert EventKind.STEP_COMPLETED not in await kinds(a, "b")
            assert await storage.timers.pending("b") == ()


async def test_the_deadline_goes_on_through_continue_as_new(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def rounds(ctx: Context, n: int) -> int:
        await ctx.sleep(20)
        if n < 10:
            ctx.continue_as_new(n + 1)
        return n

    handle = await app.start(rounds, 0, id="r", execution_timeout=50)
    root = await app.inspect("r")
    await clock.advance(20)
    await clock.advance(20)
    first, second = await app.inspect("r#1"), await app.inspect("r#2")
    assert first.deadline == second.deadline == root.deadline
    assert await app.storage.timers.pending("r") == ()
    await clock.advance(10)
    with pytest.raises(ExecutionTimedOutError) as caught:
        await handle.result(timeout=5)
    assert caught.value.execution_id == "r"  # the id the caller knows; r#2 timed out
    assert (await app.inspect("r#2")).timed_out
    assert await app.storage.timers.pending("r#2") == ()


async def test_execute_takes_the_deadline_too(app: Loom, clock: VirtualClock) -> None:
    @app.workflow()
    async def waits(ctx: Context) -> object:
        return await ctx.receive("never")

    call = asyncio.ensure_future(app.execute(waits, id="e", execution_timeout=15))
    await clock.advance(15)
    with pytest.raises(ExecutionTimedOutError):
        await asyncio.wait_for(call, 5)


@pytest.mark.parametrize(
    "bad", [0, -1, 0.0, math.nan, math.inf, True, "60", timedelta(0), 10**12]
)
async def test_a_bad_timeout_is_refused_and_writes_nothing(app: Loom, bad: object) -> None:
    @app.workflow()
    async def noop(ctx: Context) -> None:
        return None

    with pytest.raises(InvalidDurationError) as caught:
        await app.start(noop, id="x", execution_timeout=bad)  # type: ignore[call-overload, call-arg]
    assert "execution_timeout" in str(caught.value)
    with pytest.raises(InvalidDurationError):
        await app.execute(noop, id="x", execution_timeout=bad)  # type: ignore[call-overload, call-arg]
    assert await app.storage.events.head("x") == 0
    assert await app.storage.timers.pending("x") == ()


async def test_a_deadline_past_the_last_instant_the_runtime_keeps_is_refused() -> None:
    clock = VirtualClock(start=datetime(9998, 12, 31, tzinfo=UTC))
    async with Loom("memory://", clock=clock) as app:

        @app.workflow()
        async def noop(ctx: Context) -> None:
            return None

        with pytest.raises(InvalidDurationError, match="9999-01-01"):
            await app.start(noop, id="late", execution_timeout=timedelta(days=2))
        assert await app.storage.events.head("late") == 0
        await app.start(noop, id="late", execution_timeout=timedelta(hours=1))


async def test_a_refused_start_writes_no_row_and_attach_keeps_the_first_deadline(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def parked(ctx: Context) -> object:
        return await ctx.receive("go")

    await app.start(parked, id="p", execution_timeout=100)
    await clock.advance(10)
    before = await app.storage.timers.pending("p")
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.start(parked, id="p", execution_timeout=5)
    handle = await app.start(parked, id="p", if_exists="attach", execution_timeout=5)
    assert await app.storage.timers.pending("p") == before
    await clock.advance(5)
    assert await handle.status() == "suspended"
    await clock.advance(85)
    with pytest.raises(ExecutionTimedOutError):
        await handle.result(timeout=5)


async def test_a_lost_deadline_row_is_written_again_by_the_next_driver(
    app: Loom, clock: VirtualClock
) -> None:
    """The row is written after EXECUTION_STARTED: a process that dies between the two
    leaves none. The recovery that takes the execution over writes it again, as does
    every park."""

    entered = asyncio.Event()
    release = asyncio.Event()

    async def work() -> str:
        entered.set()
        await release.wait()
        return "w"

    @app.workflow()
    async def job(ctx: Context) -> object:
        await ctx.step(work)
        return await ctx.receive("go")

    crash_at(app, step="work", when="before")
    handle = await app.start(job, id="j", execution_timeout=40)
    await app.drain()
    # Taken away, as a process that died between the start's two writes leaves it.
    assert await app.storage.timers.cancel("j") == 1
    assert [h.execution_id for h in await app.recover()] == ["j"]
    await entered.wait()  # running, before any park: the takeover wrote the row
    assert await rows(app, "j") == [40.0]
    release.set()
    await clock.advance(40)
    with pytest.raises(ExecutionTimedOutError):
        await handle.result(timeout=5)


async def test_a_park_writes_the_deadline_row_again(app: Loom, clock: VirtualClock) -> None:
    @app.workflow()
    async def twice(ctx: Context) -> object:
        await ctx.receive("one")
        return await ctx.receive("two")

    handle = await app.start(twice, id="t", execution_timeout=30)
    await clock.advance(0)
    await app.storage.timers.cancel("t")  # lost, as to a failed write
    await app.send("t", "one", 1)
    await clock.advance(0)
    assert await rows(app, "t") == [30.0]
    await clock.advance(30)
    with pytest.raises(ExecutionTimedOutError):
        await handle.result(timeout=5)


@pytest.mark.parametrize("meanwhile", ["cancel", "recover"])
async def test_a_start_interrupted_while_it_writes_the_row_runs_once(meanwhile: str) -> None:
    """While the row is written after EXECUTION_STARTED: a caller cancelled then has its
    execution carried on by the app (with its row), as for any start cancelled after its
    write; a recovery then waits for the start rather than driving it a second time."""
    clock = VirtualClock()
    ran: list[str] = []

    def work() -> None:
        ran.append("work")

    async def job(ctx: Context) -> object:
        await ctx.step(work)
        return await ctx.receive("go")

    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", clock=clock, recover=False)
        app.workflow(name="job")(job)
        writing, release = asyncio.Event(), asyncio.Event()
        schedule = storage.timers.schedule

        async def held(row: TimerRecord) -> None:
            if not writing.is_set():
                writing.set()
                await release.wait()
            await schedule(row)

        storage.timers.schedule = held  # type: ignore[method-assign,assignment]
        async with app:
            start = asyncio.ensure_future(app.start(job, id="s", execution_timeout=30))
            await writing.wait()
            if meanwhile == "cancel":
                start.cancel()
                release.set()
                with pytest.raises(asyncio.CancelledError):
                    await start
            else:
                recovering = asyncio.ensure_future(app.recover())
                await asyncio.sleep(0)
                release.set()
                await start
                await recovering
            await clock.advance(0)
            assert ran == ["work"]
            assert (await app.inspect("s")).status == "suspended"
            assert await rows(app, "s") == [30.0]
            await clock.advance(30)
            with pytest.raises(ExecutionTimedOutError):
                await app.get("s").result(timeout=5)


async def test_a_run_past_the_deadline_stops_before_its_next_write() -> None:
    """No timer service here: the run itself notices. A step that returns after the
    deadline has its result dropped, and the step after it never runs."""
    clock = VirtualClock()
    busy = Busy()
    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", clock=clock, timers=False)
        app.workflow(name="busy")(busy.body)
        async with app:
            handle = await app.start(busy.body, id="p", execution_timeout=5)
            await busy.entered.wait()
            await clock.advance(6)
            busy.release.set()
            await app.drain()
            with pytest.raises(ExecutionTimedOutError):
                await handle.result(timeout=5)
            assert busy.after == []
            assert EventKind.STEP_COMPLETED not in await kinds(app, "p")


async def test_a_recovery_after_the_deadline_cancels_rather_than_runs() -> None:
    clock = VirtualClock()
    calls: list[str] = []
    entered = asyncio.Event()

    async def stuck() -> None:
        calls.append("stuck")
        if len(calls) == 1:
            entered.set()
            await asyncio.Event().wait()  # the process dies in it

    async def job(ctx: Context) -> None:
        await ctx.step(stuck)

    async with open_storage("memory://") as storage:
        first = Loom(storage, node="n", clock=clock, timers=False)
        first.workflow(name="job")(job)
        async with first:
            await first.start(job, id="r", execution_timeout=10)
            await entered.wait()
        await clock.advance(60)  # down past the deadline
        again = Loom(storage, node="n", clock=clock, timers=False)
        again.workflow(name="job")(job)
        async with again:
            await again.drain()
            with pytest.raises(ExecutionTimedOutError):
                await again.get("r").result(timeout=5)
        assert calls == ["stuck"]


async def test_a_sleep_due_before_the_deadline_but_fired_after_it_cancels() -> None:
    clock = VirtualClock()
    after: list[str] = []

    def next_step() -> None:
        after.append("ran")

    async def napper(ctx: Context) -> None:
        await ctx.sleep(5)
        await ctx.step(next_step)

    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", clock=clock, timers=False)
        app.workflow(name="napper")(napper)
        async with app:
            await app.start(napper, id="z", execution_timeout=10)
            await app.drain()
            await clock.advance(20)  # both rows due by the next poll
            fired = await app.timer_service.poll_once()
            assert sorted(fired.values()) == ["obsolete", "timed-out"]
            await app.drain()
            assert after == []
            assert (await app.inspect("z")).timed_out


async def test_one_advance_times_out_more_executions_than_a_poll_takes(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow(name="waiter")
    async def waiter(ctx: Context) -> object:
        return await ctx.receive("never")

    count = 2 * app.timer_service.batch + 50  # an advance polls at least twice
    for k in range(count):
        await app.start(waiter, id=f"w{k}", execution_timeout=60)
    await clock.advance(60)
    timed_out = [v async for v in app.executions(status="cancelled")]
    assert len(timed_out) == count
    assert all(v.timed_out for v in timed_out)
