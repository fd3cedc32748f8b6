"""The timer service (``app.timer_service.poll_once()``, driven by hand on a virtual clock):
due rows resume through the conditional acquire, rows whose wait is answered are retired,
and a contended wake backs off in process, with full jitter, then gives up once."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import pytest
from loom_runtime import AppNotRunningError, Context, Loom, RedriveExhaustedError, TimerService
from loom_runtime.testing import VirtualClock
from loom_runtime.timers import Fired
from store_probes import ForwardingTimers, ProbedEventStore, Wired, kinds, nap, token_of, wired

from loom_core import (
    EventKind,
    FenceAcquired,
    FenceStale,
    InvalidOptionError,
    Redrive,
    Storage,
    StorageUnavailableError,
    TimerRecord,
    TimerStore,
    open_storage,
)

SEED = 11


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"


async def parked(w: Wired, workflow: str = "nap", execution_id: str = "n") -> int:
    await w.app.start(workflow, id=execution_id)
    await w.app.drain()
    view = await w.app.inspect(execution_id)
    assert view.status == "suspended"
    assert view.park is not None
    return view.park.sequence


async def rows(w: Wired, execution_id: str = "n") -> list[TimerRecord]:
    return list(await w.base.timers.pending(execution_id))


async def answers(w: Wired, execution_id: str = "n") -> list[object]:
    """The answer kinds of the execution's EXECUTION_RESUMED events, in order."""
    out: list[object] = []
    for event in await w.base.events.read(execution_id):
        if event.kind == EventKind.EXECUTION_RESUMED and isinstance(event.payload, dict):
            answer = event.payload["answer"]
            assert isinstance(answer, dict)
            out.append(answer["kind"])
    return out


def contend(w: Wired) -> None:
    """Before every acquire of the runtime, a rival takes the token and dies."""

    async def dead_acquirer(execution_id: str) -> None:
        await w.base.events.acquire_fence(execution_id)

    w.probe.before_acquire = dead_acquirer


async def test_a_due_row_resumes_its_park_through_the_conditional_acquire(url: str) -> None:
    async with wired(url) as w:
        park = await parked(w)
        (row,) = await rows(w)
        assert row.wake_at == w.clock.now() + timedelta(seconds=60)
        assert await w.base.events.acquire_fence_if("n", fence=0, park_seq=park) == (
            FenceAcquired(1)  # a dead acquirer: the wake goes through the retry
        )
        await w.clock.advance(59)
        assert await w.app.timer_service.poll_once() == {}
        await w.clock.advance(1)
        assert await w.app.timer_service.poll_once() == {row: "resumed"}
        assert [(c.fence, c.park_seq, c.result) for c in w.probe.of("acquire_fence_if")] == [
            (0, park, FenceStale(1)), (1, park, FenceAcquired(2))
        ]
        await w.app.drain()
        assert await w.app.get("n").result() == "awake"
        assert await rows(w) == []


async def sleeps(ctx: Context) -> str:
    await ctx.sleep(60)
    await ctx.sleep(100)
    return "rested"


async def test_a_row_whose_wait_was_answered_is_retired_as_obsolete_and_wakes_nothing(
    url: str,
) -> None:
    async with wired(url) as w:
        w.app.workflow(name="sleeps")(sleeps)
        park = await parked(w, "sleeps")
        (first,) = await rows(w)
        await w.app.resume("n", fence_if_parked_at=park)  # answers the 60 s sleep early
        await w.app.drain()
        assert (await w.app.inspect("n")).status == "suspended"  # on the 100 s sleep
        second = next(r for r in await rows(w) if r != first)
        acquires = len(w.probe.calls)
        await w.clock.advance(60)
        assert await w.app.timer_service.poll_once() == {first: "obsolete"}
        assert await rows(w) == [second]
        assert (await w.app.inspect("n")).status == "suspended"
        assert await answers(w) == ["timer"]
        assert w.probe.of("acquire_fence_if")[acquires:] == []
        await w.clock.advance(40)
        assert await w.app.timer_service.poll_once() == {second: "resumed"}
        await w.app.drain()
        assert await w.app.get("n").result() == "rested"


async def reply_then_rest(ctx: Context) -> object:
    value = await ctx.receive("approve", timeout=60)
    await ctx.sleep(100)
    return value


async def test_a_message_timeout_row_is_retired_once_the_message_answered_its_wait(
    url: str,
) -> None:
    async with wired(url) as w:
        w.app.workflow(name="reply_then_rest")(reply_then_rest)
        await parked(w, "reply_then_rest")
        (timeout,) = await rows(w)
        await w.clock.advance(10)
        await w.app.send("n", "approve", "yes")  # delivered; the body sleeps 100 s
        await w.app.drain()
        (rest,) = [r for r in await rows(w) if r != timeout]
        assert await rows(w) == [timeout, rest]  # the send's own wake row is retired
        await w.clock.advance(50)
        assert await w.app.timer_service.poll_once() == {timeout: "obsolete"}
        assert (await w.app.inspect("n")).status == "suspended"  # the sleep was not woken
        assert await answers(w) == ["message"]
        await w.clock.advance(50)
        assert await w.app.timer_service.poll_once() == {rest: "resumed"}
        await w.app.drain()
        assert await w.app.get("n").result() == "yes"


async def reply_or_nap(ctx: Context) -> object:
    value, _ = await ctx.gather(ctx.receive("approve", timeout=60), ctx.sleep(30))
    return value


async def test_in_a_park_on_a_message_and_a_timer_the_timeout_row_waits_for_its_own_wait(
    url: str,
) -> None:
    async with wired(url) as w:
        w.app.workflow(name="reply_or_nap")(reply_or_nap)
        await parked(w, "reply_or_nap")
        nap_row, timeout = await rows(w)
        assert timeout.wake_at - nap_row.wake_at == timedelta(seconds=30)
        await w.clock.advance(30)
        assert await w.app.timer_service.poll_once() == {nap_row: "resumed"}
        await w.app.drain()
        # The park the body wrote next waits for the message alone: its timeout row stays.
        assert (await w.app.inspect("n")).status == "suspended"
        assert await rows(w) == [timeout]
        await w.clock.advance(30)
        assert await w.app.timer_service.poll_once() == {timeout: "resumed"}
        await w.app.drain()
        assert await w.app.get("n").result() is None
        assert await answers(w) == ["timer", "timeout"]


async def reply_and_rest(ctx: Context) -> object:
    value, _ = await ctx.gather(ctx.receive("approve", timeout=60), ctx.sleep(100))
    return value


async def test_a_timeout_row_whose_wait_a_message_answered_is_retired_while_the_park_is_open(
    url: str,
) -> None:
    async with wired(url) as w:
        w.app.workflow(name="reply_and_rest")(reply_and_rest)
        await parked(w, "reply_and_rest")
        timeout, rest = await rows(w)
        await w.clock.advance(10)
        await w.app.send("n", "approve", "yes")
        await w.app.drain()
        assert (await w.app.inspect("n")).status == "suspended"  # on the 100 s sleep
        acquires = len(w.probe.calls)
        await w.clock.advance(50)
        assert await w.app.timer_service.poll_once() == {timeout: "obsolete"}
        assert await answers(w) == ["message"]
        assert w.probe.of("acquire_fence_if")[acquires:] == []
        await w.clock.advance(40)
        assert await w.app.timer_service.poll_once() == {rest: "resumed"}
        await w.app.drain()
        assert await w.app.get("n").result() == "yes"


async def test_a_row_due_while_its_execution_runs_is_left_to_its_driver() -> None:
    release = asyncio.Event()

    async def hold() -> str:
        await release.wait()
        return "held"

    async def busy(ctx: Context) -> object:
        async def first() -> None:
            await ctx.sleep(10)
            await ctx.step(hold, name="hold")

        await ctx.gather(first(), ctx.sleep(60))
        return "done"

    async with wired() as w:
        w.app.workflow(name="busy")(busy)
        await parked(w, "busy")
        short, long = await rows(w)
        await w.clock.advance(10)
        assert await w.app.timer_service.poll_once() == {short: "resumed"}
        assert (await w.app.inspect("n")).status == "running"  # one branch holds
        await w.clock.advance(50)
        assert await w.app.timer_service.poll_once() == {long: "left"}
        assert await rows(w) == [long]
        release.set()  # the body parks on the due sleep, and answers it itself
        await w.app.drain()
        assert await w.app.get("n").result() == "done"
        assert await rows(w) == []


async def receive_then_rest(ctx: Context) -> object:
    value = await ctx.receive("approve")
    await ctx.sleep(100)
    return value


async def test_a_send_that_delivered_its_message_retires_its_own_wake_row(url: str) -> None:
    async with wired(url) as w:
        w.app.workflow(name="receive_then_rest")(receive_then_rest)
        await parked(w, "receive_then_rest")
        assert await rows(w) == []
        await w.app.send("n", "approve", "yes")
        await w.app.drain()
        assert await answers(w) == ["message"]
        (rest,) = await rows(w)  # only the 100 s sleep's: the send's row did its work
        assert rest.wake_at == w.clock.now() + timedelta(seconds=100)


async def test_rows_of_executions_backing_off_do_not_hide_the_due_rows_behind_them() -> None:
    async with wired() as w:
        service = TimerService(w.app, batch=2)
        for execution_id in ("a", "b", "c"):
            await parked(w, execution_id=execution_id)
        await w.clock.advance(1)
        await parked(w, execution_id="z")  # due last
        (late,) = await rows(w, "z")

        async def dead_acquirer(execution_id: str) -> None:
            if execution_id != "z":
                await w.base.events.acquire_fence(execution_id)

        w.probe.before_acquire = dead_acquirer
        await w.clock.advance(60)
        first = await service.poll_once()
        assert sorted(r.execution_id for r in first) == ["a", "b"]
        assert set(first.values()) == {"backing-off"}
        second = await service.poll_once()  # goes on after b: c and z, then a full batch
        assert {r.execution_id: what for r, what in second.items()} == {
            "c": "backing-off", "z": "resumed"
        }
        assert late in second
        await w.app.drain()
        assert await w.app.get("z").result() == "awake"


def jitter(rng: random.Random, attempt: int) -> timedelta:
    """The documented schedule: full jitter up to min(30 s, 0.2 s * 2**(attempt - 1))."""
    return timedelta(seconds=rng.random() * min(30, 0.2 * 2 ** (attempt - 1)))


async def test_a_contended_wake_backs_off_with_full_jitter_then_reports_exhaustion_once(
    url: str,
) -> None:
    async with wired(url, seed=SEED) as w:
        service = w.app.timer_service
        assert service.max_attempts == 8
        park = await parked(w)
        before = await w.base.events.read("n")
        (row,) = await rows(w)
        contend(w)
        await w.clock.advance(60)
        draws = random.Random(SEED)  # the app's random, drawn by nothing else here
        for attempt in range(1, 8):
            tries = len(w.probe.of("acquire_fence_if"))
            now = w.clock.now()
            assert await service.poll_once() == {row: "backing-off"}
            assert len(w.probe.of("acquire_fence_if")) == tries + 3  # one contended wake
            next_try = now + jitter(draws, attempt)
            assert service.backing_off() == {"n": (attempt, next_try)}
            if next_try > now:  # no acquire at all before the next try
                assert await service.poll_once() == {row: "backing-off"}
                assert len(w.probe.of("acquire_fence_if")) == tries + 3
            await w.clock.advance(next_try - now)
        assert await service.poll_once() == {row: "exhausted"}
        assert len(w.probe.of("acquire_fence_if")) == 8 * 3
        assert [type(e) for e in w.errors] == [RedriveExhaustedError]
        exhausted = w.errors[0]
        assert isinstance(exhausted, RedriveExhaustedError)
        assert (exhausted.execution_id, exhausted.attempts) == ("n", 8)
        assert await rows(w) == []
        assert service.backing_off() == {}
        assert await service.poll_once() == {}
        assert len(w.errors) == 1
        # The park is left unanswered, the log untouched, for an operator or a recovery.
        assert await w.base.events.read("n") == before
        view = await w.app.inspect("n")
        assert view.park is not None
        assert view.park.sequence == park
        assert await token_of(w.base.events, "n") == 8 * 3


class SteppedClock:
    """A wall clock the test sets, backwards too, as NTP or an operator steps one."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()  # nothing in these tests waits on it to return


async def test_a_wake_backing_off_is_tried_again_once_the_clock_steps_back(url: str) -> None:
    """A contended wake backs off at most ``backoff_cap`` seconds; the clock then steps
    back an hour (the row is still due): the next poll tries it and resumes the park,
    rather than passing it over until the clock has made up the hour."""
    base = await open_storage(url)
    probe = ProbedEventStore(base.events)
    clock = SteppedClock(datetime(2030, 1, 1, tzinfo=UTC))
    app = Loom(
        Storage(probe, base.timers, base.leases, url=base.url), node="n1", clock=clock,
        random=random.Random(SEED), timers=False, recover=False,
    )
    app.workflow(name="nap")(nap)
    try:
        async with app:
            await app.start("nap", id="n")
            await app.drain()
            (row,) = await base.timers.pending("n")
            clock.at += timedelta(hours=2)

            async def dead_acquirer(execution_id: str) -> None:
                await base.events.acquire_fence(execution_id)

            probe.before_acquire = dead_acquirer
            assert await app.timer_service.poll_once() == {row: "backing-off"}
            probe.before_acquire = None
            clock.at -= timedelta(hours=1)
            assert await app.timer_service.poll_once() == {row: "resumed"}
            await app.drain()
            assert await app.get("n").result() == "awake"
    finally:
        await base.close()


async def test_a_contended_park_with_two_due_rows_gives_up_once_for_both(url: str) -> None:
    async with wired(url, seed=SEED) as w:

        @w.app.workflow(name="two-naps")
        async def two_naps(ctx: Context) -> None:
            await ctx.gather(ctx.sleep(60), ctx.sleep(61))

        await w.app.start("two-naps", id="n")
        await w.app.drain()
        assert len(await rows(w)) == 2
        before = await w.base.events.read("n")
        contend(w)
        await w.clock.advance(120)
        service = w.app.timer_service
        fired: dict[TimerRecord, object] = {}
        for _ in range(8):
            fired = dict(await service.poll_once())
            await w.clock.advance(31)  # past any next try: every poll is an attempt
        # Eight contended wakes in all (three acquires each), one report, both rows gone:
        # the other row did not start the tries over at once.
        assert sorted(map(str, fired.values())) == ["exhausted", "exhausted"]
        assert len(w.probe.of("acquire_fence_if")) == 8 * 3
        assert [type(e) for e in w.errors] == [RedriveExhaustedError]
        assert await rows(w) == []
        assert await service.poll_once() == {}
        assert await w.base.events.read("n") == before


async def test_a_re_driver_that_raises_counts_as_contended_and_the_poll_goes_on() -> None:
    async with wired(seed=SEED) as w:
        calls: list[TimerRecord] = []

        async def buggy(row: TimerRecord) -> Literal["done", "noop", "contended"]:
            calls.append(row)
            raise RuntimeError("a re-driver's own bug")

        service = TimerService(w.app, redrivers=[buggy])
        await parked(w)  # a plain wake, due at +60 s, behind the re-drive row
        first = TimerRecord("r", w.clock.now(), Redrive(0))
        await w.app.schedule_wake(first)
        await w.clock.advance(60)
        fired = await service.poll_once()
        assert calls == [first]
        assert [type(e) for e in w.errors] == [RuntimeError]
        (again,) = await w.base.timers.pending("r")  # the next row, attempt 1, after it
        assert again.redrive == Redrive(1)
        assert again.wake_at > first.wake_at
        assert {r.execution_id: what for r, what in fired.items()} == {"n": "resumed"}
        await w.app.drain()
        assert await w.app.get("n").result() == "awake"


async def test_a_contended_re_drive_writes_its_next_row_then_gives_up_once() -> None:
    async with wired(seed=SEED) as w:

        async def contended(row: TimerRecord) -> Literal["done", "noop", "contended"]:
            return "contended"

        service = TimerService(w.app, redrivers=[contended])
        row = TimerRecord("r", w.clock.now(), Redrive(0))
        await w.app.schedule_wake(row)
        draws = random.Random(SEED)  # the app's random, drawn by nothing else here
        for attempt in range(1, 8):
            await service.poll_once()
            (row,) = await w.base.timers.pending("r")
            assert row.redrive == Redrive(attempt)
            assert row.wake_at == w.clock.now() + jitter(draws, attempt)
            await w.clock.advance(row.wake_at - w.clock.now())
        assert w.errors == []
        await service.poll_once()
        assert await w.base.timers.pending("r") == ()
        (exhausted,) = w.errors
        assert isinstance(exhausted, RedriveExhaustedError)
        assert (exhausted.execution_id, exhausted.attempts) == ("r", 8)


async def test_the_backoff_ceiling_stops_at_thirty_seconds() -> None:
    async with wired(seed=SEED) as w:
        service = TimerService(w.app, max_attempts=12)
        await parked(w)
        (row,) = await rows(w)
        contend(w)
        await w.clock.advance(60)
        draws = random.Random(SEED)
        for attempt in range(1, 12):
            now = w.clock.now()
            assert await service.poll_once() == {row: "backing-off"}
            next_try = now + jitter(draws, attempt)
            assert service.backing_off() == {"n": (attempt, next_try)}
            if attempt >= 9:  # 0.2 s * 2**8 is 51.2 s: capped
                assert next_try - now < timedelta(seconds=30)
            await w.clock.advance(next_try - now)
        assert await service.poll_once() == {row: "exhausted"}


async def test_the_backoff_memory_holds_1024_executions_and_forgets_the_oldest_first() -> None:
    async with wired(seed=SEED) as w:
        service = w.app.timer_service
        ids = [f"e{i:04d}" for i in range(1025)]
        for execution_id in ids:
            await w.app.start("nap", id=execution_id)
        await w.app.drain()
        await w.clock.advance(61)
        await w.app.start("nap", id="plain")  # uncontended, due last of all
        await w.app.drain()
        contended = set(ids)

        async def dead_acquirer(execution_id: str) -> None:
            if execution_id in contended:
                await w.base.events.acquire_fence(execution_id)

        w.probe.before_acquire = dead_acquirer
        await w.clock.advance(60)
        (plain,) = await rows(w, "plain")
        polls = 0
        while (fired := await service.poll_once()).get(plain) != "resumed":
            polls += 1  # 100 rows tried a poll; rows backing off do not count against it
            assert polls < 11, "the plain wake was never reached"
        backing_off = service.backing_off()
        assert len(backing_off) == 1024
        assert {r.execution_id for r, what in fired.items() if what == "backing-off"} >= set(
            ids[1000:]
        )
        # e0000, the oldest, was forgotten when e1024 came; past the plain row the poll
        # went round to it, and forgotten means a fresh start: tried as attempt 1, which
        # forgets the next oldest, tried in turn, until the batch is full.
        assert backing_off["e0000"][0] == 1
        assert len(set(ids) - set(backing_off)) == 1
        await w.app.drain()
        assert await w.app.get("plain").result() == "awake"
        assert await kinds(w.base.events, "e0000") == [
            EventKind.EXECUTION_STARTED, EventKind.EXECUTION_SUSPENDED
        ]


async def test_a_park_whose_row_was_taken_is_rearmed_when_its_node_restarts(url: str) -> None:
    # Rows are keyed by execution and instant: a later wait at an earlier wait's instant
    # shares its row, and whoever retires that row for the earlier wait can take it from
    # the later park. Here the row is simply gone, as it is then: nothing wakes the park
    # until its node starts again, whose recovery schedules the row once more.
    clock = VirtualClock()
    async with open_storage(url) as storage:
        first = Loom(storage, node="a", clock=clock, timers=False, recover=False)

        @first.workflow(name="nap")
        async def nap(ctx: Context) -> str:
            await ctx.sleep(60)
            return "woke"

        async with first:
            await first.start(nap, id="n")
            await first.drain()
            (row,) = await storage.timers.pending("n")
            assert await storage.timers.complete("n", row.wake_at)
            await clock.advance(61)
            assert await first.timer_service.poll_once() == {}
            assert (await first.inspect("n")).status == "suspended"
        again = Loom(storage, node="a", clock=clock, timers=False, recover=False)
        again.workflow(name="nap")(nap)
        async with again:
            assert await again.recover() == []
            assert [r.wake_at for r in await storage.timers.pending("n")] == [row.wake_at]
            await again.timer_service.poll_once()
            assert await again.get("n").result(timeout=5) == "woke"


async def test_a_message_left_without_a_row_is_rearmed_when_its_node_restarts(url: str) -> None:
    # A timer service that retired a wake row as having nothing to answer looks again
    # afterwards; one that dies in between leaves a stored message with no row. The
    # parked receiver's node, restarted, puts a row back, and the message is delivered.
    clock = VirtualClock()
    async with open_storage(url) as storage:
        first = Loom(storage, node="a", clock=clock, timers=False, recover=False)

        @first.workflow(name="wait_note")
        async def wait_note(ctx: Context) -> object:
            return await ctx.receive("note")

        async with first:
            await first.start(wait_note, id="r")
            await first.drain()
            await first.inbox.put("r", "note", "hello", None)  # stored; its row is gone
            assert await storage.timers.pending("r") == ()
            assert await first.timer_service.poll_once() == {}
        again = Loom(storage, node="a", clock=clock, timers=False, recover=False)
        again.workflow(name="wait_note")(wait_note)
        async with again:
            assert await again.recover() == []
            assert len(await storage.timers.pending("r")) == 1
            await again.timer_service.poll_once()
            assert await again.get("r").result(timeout=5) == "hello"


async def test_a_park_whose_row_was_taken_is_rearmed_when_its_own_answer_fails() -> None:
    # A zero-length sleep parks with its wait due, and the run answers it itself. When
    # that answer cannot be made (rivals keep taking the fence) and the row was taken,
    # the run puts the row back for the timer service.
    async with wired() as w:

        @w.app.workflow(name="blink")
        async def blink(ctx: Context) -> str:
            await ctx.sleep(0)
            return "done"

        async def take_row_and_the_fence(execution_id: str) -> None:
            for row in await w.base.timers.pending(execution_id):
                await w.base.timers.complete(execution_id, row.wake_at)
            await w.base.events.acquire_fence(execution_id)

        w.probe.before_acquire = take_row_and_the_fence
        await w.app.start(blink, id="b")
        await w.app.drain()
        assert (await w.app.inspect("b")).status == "suspended"
        assert len(await w.base.timers.pending("b")) == 1
        w.probe.before_acquire = None
        await w.app.timer_service.poll_once()
        await w.app.drain()
        assert await w.app.get("b").result(timeout=5) == "done"


async def test_a_row_of_a_workflow_this_app_lacks_is_reported_once_and_tried_ever_less_often(
) -> None:
    """A node that does not register the workflow cannot wake it; one that does may. The
    row is left for it, tried here again after a growing wait (never given up), and
    ``on_error`` hears of it once, however long it stays."""
    async with wired(seed=SEED) as w:
        await parked(w)
        (row,) = await rows(w)
        errors: list[BaseException] = []
        other = Loom(
            w.base, node="other", clock=w.clock, random=random.Random(SEED), timers=False,
            recover=False, on_error=errors.append,
        )
        async with other:
            await w.clock.advance(60)
            tries = 0
            for _ in range(2400):  # ten minutes of polls, every quarter of a second
                if (await other.timer_service.poll_once()).get(row) == "backing-off":
                    entry = other.timer_service.backing_off().get("n")
                    assert entry is not None
                    tries = entry[0]
                await w.clock.advance(0.25)
            assert [type(e).__name__ for e in errors] == ["WorkflowNotFoundError"]
            # 0.2 s doubling to the 30 s cap, each wait drawn from [0, ceiling): at least
            # one try per 30 s once capped, far fewer than one per poll.
            assert 20 <= tries <= 60
            assert await rows(w) == [row]
        await w.app.timer_service.poll_once()  # a node with the workflow wakes it
        await w.app.drain()
        assert await w.app.get("n").result(timeout=5) == "awake"


async def test_rows_left_for_running_executions_do_not_hide_a_due_row_behind_them() -> None:
    """More rows than a batch, each of an execution that is running (a message's wake
    row, say, while its receiver is in a long step), all older than a parked execution's
    due row: they are left, and looked at again only after a backoff, so the next poll
    reaches the row behind them rather than the same batch again, for as long as they
    stay."""
    release = asyncio.Event()

    async def hold() -> None:
        await release.wait()

    async def held(ctx: Context) -> None:
        await ctx.step(hold)

    async with wired() as w:
        w.app.workflow(name="held")(held)
        await parked(w)
        (nap_row,) = await rows(w)
        batch = w.app.timer_service.batch
        for i in range(batch + 20):
            await w.app.start("held", id=f"h-{i:03}")
            await w.base.timers.schedule(TimerRecord(f"h-{i:03}", w.clock.now()))
        await w.clock.advance(60)
        first = await w.app.timer_service.poll_once()
        assert list(first.values()) == ["left"] * batch  # a batch of them, as before
        second = await w.app.timer_service.poll_once()
        assert second[nap_row] == "resumed"
        assert list(second.values()).count("left") == batch + 20
        assert await w.app.get("n").result(timeout=5) == "awake"
        release.set()
        await w.app.drain()


class CountedTimers(ForwardingTimers):
    """Forwards to a timer store, counting the ``due`` calls and the rows they return."""

    def __init__(self, inner: TimerStore) -> None:
        super().__init__(inner)
        self.due_calls = 0
        self.rows_read = 0

    async def due(
        self, now: datetime, *, limit: int = 100, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        got = await self.inner.due(now, limit=limit, redrive=redrive)
        self.due_calls += 1
        self.rows_read += len(got)
        return got


@asynccontextmanager
async def held_rows(url: str, count: int) -> AsyncIterator[tuple[Wired, CountedTimers]]:
    """``count`` executions in a step that waits for the test, each with a due row, older
    than the due row of "n", parked on a sleep; the app's timers counted."""
    release = asyncio.Event()

    async def hold() -> None:
        await release.wait()

    async def held(ctx: Context) -> None:
        await ctx.step(hold)

    counted: list[CountedTimers] = []

    def counting(inner: TimerStore) -> TimerStore:
        counted.append(CountedTimers(inner))
        return counted[0]

    async with wired(url, timers=counting) as w:
        w.app.workflow(name="held")(held)
        await parked(w)  # its row falls due 60 s on
        for i in range(count):
            await w.app.start("held", id=f"h-{i:03}")
            await w.base.timers.schedule(TimerRecord(f"h-{i:03}", w.clock.now()))
        await w.clock.advance(60)
        yield w, counted[0]
        release.set()
        await w.app.drain()


async def test_more_left_rows_than_the_service_remembers_are_tried_in_turn_not_hiding_a_row(
    url: str,
) -> None:
    """Twelve rows left (their executions run), a service that remembers three and tries
    two a poll: each poll goes on where the one before stopped, so the row behind them
    is resumed by the seventh poll. (Before, the oldest rows, forgotten, were tried
    again on every poll, which never got past them.)"""
    async with held_rows(url, 12) as (w, _):
        service = TimerService(w.app, batch=2, capacity=3)
        (nap_row,) = await rows(w)
        for _ in range(7):
            if (await service.poll_once()).get(nap_row) == "resumed":
                break
        else:
            raise AssertionError("the row behind the left rows was never reached")
        assert await w.app.get("n").result(timeout=5) == "awake"


async def test_a_poll_reads_past_rows_it_passes_over_in_few_store_calls(url: str) -> None:
    """Sixty left rows, all remembered, then the row behind them: the poll that reaches
    it reads past them asking for twice as many rows each time, in 6 calls (2, 4, ...,
    64 rows asked for), not in one call per batch, each reading every row before it again
    (31 calls, 991 rows)."""
    async with held_rows(url, 60) as (w, counted):
        service = TimerService(w.app, batch=2)
        (nap_row,) = await rows(w)
        for _ in range(30):
            assert set((await service.poll_once()).values()) == {"left"}
        counted.due_calls = counted.rows_read = 0
        assert (await service.poll_once())[nap_row] == "resumed"
        assert (counted.due_calls, counted.rows_read) == (6, 2 + 4 + 8 + 16 + 32 + 61)
        assert await w.app.get("n").result(timeout=5) == "awake"


async def test_a_row_the_store_fails_to_retire_is_reported_once_and_the_poll_goes_on() -> None:
    """Retiring a fired row fails (a full disk): the execution is resumed all the same,
    ``on_error`` hears of it once however many polls meet the failure, the rows behind it
    are fired in the same poll, and the row is retired once the store takes it."""
    async with wired(seed=SEED) as w:
        w.app.workflow(name="sleeps")(sleeps)
        await parked(w, "sleeps", execution_id="a")
        await parked(w, "sleeps", execution_id="b")
        (first_a,) = await rows(w, "a")
        (first_b,) = await rows(w, "b")
        timers = w.base.timers
        real_complete = timers.complete
        full = True

        async def complete(execution_id: str, wake_at: datetime) -> bool:
            if full:
                raise StorageUnavailableError(f"complete on {execution_id!r}: the disk is full")
            return await real_complete(execution_id, wake_at)

        timers.complete = complete  # type: ignore[method-assign]
        await w.clock.advance(60)
        assert await w.app.timer_service.poll_once() == {
            first_a: "backing-off", first_b: "backing-off"
        }
        await w.app.drain()  # both woke, and parked on their second sleep
        assert await answers(w, "a") == await answers(w, "b") == ["timer"]
        for _ in range(40):  # ten seconds of polls while the disk stays full
            await w.clock.advance(0.25)
            await w.app.timer_service.poll_once()
        assert [type(e).__name__ for e in w.errors] == ["StorageUnavailableError"] * 2
        assert first_a in await rows(w, "a")
        assert first_b in await rows(w, "b")
        full = False
        await w.clock.advance(30)
        assert await w.app.timer_service.poll_once() == {
            first_a: "obsolete", first_b: "obsolete"
        }
        assert first_a not in await rows(w, "a")
        assert first_b not in await rows(w, "b")
        assert await answers(w, "a") == await answers(w, "b") == ["timer"]
        assert len(w.errors) == 2


@pytest.mark.parametrize("option", ["batch", "capacity", "max_attempts"])
async def test_a_count_no_store_takes_is_refused_when_the_service_is_built(option: str) -> None:
    """A batch is passed to ``due(limit=...)`` at every poll: one beyond a signed 64-bit
    integer would fail every poll, and no timer would ever fire."""
    async with wired() as w:
        with pytest.raises(InvalidOptionError, match=f"{option}=.*from 1 to 2\\*\\*63 - 1"):
            TimerService(w.app, **{option: 2**70})  # type: ignore[arg-type]


async def test_a_poll_after_the_app_left_is_refused_and_one_under_way_drives_nothing(
    url: str,
) -> None:
    """Leaving the app stops its timer service: a poll made after is refused, writing
    nothing; one under way as the app was left answers the park it was answering, and
    leaves the execution running for the node's next start, which finishes it."""
    async with wired(url) as w:
        await parked(w, execution_id="late")
        await parked(w, execution_id="under-way")
        await w.clock.advance(60)

        async def leave_the_app(execution_id: str) -> None:
            w.probe.before_acquire = None
            await w.app.__aexit__(None, None, None)

        w.probe.before_acquire = leave_the_app
        with pytest.raises(AppNotRunningError, match="cut short"):
            await w.app.timer_service.poll_once()
        (woken,) = [c.execution_id for c in w.probe.of("acquire_fence_if")]
        other = "late" if woken == "under-way" else "under-way"
        before = await w.base.events.read(other)
        with pytest.raises(AppNotRunningError, match="poll_once"):
            await w.app.timer_service.poll_once()
        assert await w.base.events.read(other) == before
        assert (await kinds(w.base.events, woken))[-1] == EventKind.EXECUTION_RESUMED
        assert w.errors == []

        again = Loom(w.base, node="n1", clock=w.clock, timers=False, recover=False)
        again.workflow(name="nap")(nap)
        async with again:
            assert [h.execution_id for h in await again.recover()] == [woken]
            assert await again.get(woken).result(timeout=5) == "awake"
            due = await w.base.timers.pending(other)
            assert await again.timer_service.poll_once() == dict.fromkeys(due, "resumed")
            assert await again.get(other).result(timeout=5) == "awake"


@pytest.mark.parametrize("window", ["before-acquire", "before-append", "after-read"])
async def test_two_services_on_one_sqlite_file_fire_each_row_once_and_the_loser_is_quiet(
    tmp_path: Path, window: str
) -> None:
    """Two apps (two nodes) on one SQLite file, each with its timer service, both after
    the same due rows. The other service fires a row in the window the test picks in
    this one's wake of it: before its acquire, between its acquire and its answer, or
    after it read the rows and before it fires any. Each park is answered once, by one of
    them; the other leaves the row or retires it as obsolete, reports nothing, and gives
    up on nothing."""
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    async with wired(url, node="a") as a, wired(url, node="b") as b:
        for i in range(3):
            await parked(a, execution_id=f"e{i}")
        await a.clock.advance(60)
        await b.clock.advance(60)
        rival: dict[str, Fired] = {}

        async def other_fires(execution_id: str) -> None:
            if execution_id not in rival:
                (row,) = await b.base.timers.pending(execution_id)
                rival[execution_id] = await b.app.timer_service.fire(row)
                await b.app.drain()

        if window == "before-acquire":
            a.probe.before_acquire = other_fires
        elif window == "before-append":

            async def before_answer(execution_id: str, kinds: tuple[str, ...]) -> None:
                if EventKind.EXECUTION_RESUMED in kinds:
                    await other_fires(execution_id)

            a.probe.before_append = before_answer
        stale = await a.base.timers.due(a.clock.now())
        if window == "after-read":
            for execution_id in ("e0", "e1", "e2"):
                await other_fires(execution_id)
            mine = [await a.app.timer_service.fire(row) for row in stale]
        else:
            mine = list((await a.app.timer_service.poll_once()).values())
        await a.app.drain()
        assert rival == {"e0": "resumed", "e1": "resumed", "e2": "resumed"}
        assert set(mine) <= {"left", "obsolete"}
        for i in range(3):
            assert await answers(a, f"e{i}") == ["timer"]
            assert (await b.app.inspect(f"e{i}")).status == "completed"
        assert await a.base.timers.due(a.clock.now()) == ()
        for service in (a.app.timer_service, b.app.timer_service):
            assert service.backing_off() == {}
        assert a.errors == b.errors == []


async def two_naps_and_the_times(ctx: Context) -> list[str]:
    await ctx.sleep(60)
    woke = ctx.now()
    await ctx.sleep(60)
    return [woke.isoformat(), ctx.now().isoformat()]


async def test_each_timer_fires_once_at_its_instant_however_the_clock_steps(url: str) -> None:
    """A deadline is an instant, computed once: a clock stepped back before it makes the
    row wait for the instant again, one stepped forward past it fires it, and one stepped
    back after it fired fires nothing again; the second sleep's deadline is counted from
    the time the body read when it woke."""
    base = await open_storage(url)
    start = datetime(2030, 1, 1, tzinfo=UTC)
    clock = SteppedClock(start)
    app = Loom(base, node="n1", clock=clock, random=random.Random(SEED), timers=False,
               recover=False)
    app.workflow(name="two")(two_naps_and_the_times)
    try:
        async with app:
            service = app.timer_service
            await app.start("two", id="t")
            await app.drain()
            clock.at = start - timedelta(hours=1)
            assert await service.poll_once() == {}
            clock.at = start + timedelta(seconds=59)
            assert await service.poll_once() == {}
            clock.at = start + timedelta(hours=2)
            assert list((await service.poll_once()).values()) == ["resumed"]
            await app.drain()
            (second,) = await base.timers.pending("t")
            assert second.wake_at == start + timedelta(hours=2, seconds=60)
            clock.at = start + timedelta(seconds=30)  # back before both deadlines
            assert await service.poll_once() == {}
            clock.at = second.wake_at
            assert await service.poll_once() == {second: "resumed"}
            await app.drain()
            assert await app.get("t").result() == [
                (start + timedelta(hours=2)).isoformat(), second.wake_at.isoformat()
            ]
            clock.at = start  # back again: nothing is left to fire
            assert await service.poll_once() == {}
            resumed = [
                e for e in await base.events.read("t") if e.kind == EventKind.EXECUTION_RESUMED
            ]
            assert len(resumed) == 2
    finally:
        await base.close()


class OutageTimers(ForwardingTimers):
    """A timer store whose ``due`` fails while ``down`` is set, as a store in an outage
    does."""

    def __init__(self, inner: TimerStore) -> None:
        super().__init__(inner)
        self.down = False
        self.failed = 0

    async def due(
        self, now: datetime, *, limit: int = 100, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        if self.down:
            self.failed += 1
            raise StorageUnavailableError("the store is down (a test's outage)")
        return await self.inner.due(now, limit=limit, redrive=redrive)


async def test_an_outage_is_reported_once_per_run_of_failing_polls_not_once_a_poll(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that fails every poll for minutes is one report, not four a second: with
    no on_error, one ERROR line for the outage and one INFO line when the polls answer
    again; a later outage is reported again."""
    base = await open_storage("memory://")
    timers = OutageTimers(base.timers)
    storage = Storage(base.events, timers, base.leases, url=base.url, on_close=base.close)
    clock = VirtualClock()
    app = Loom(storage, node="n1", clock=clock, recover=False)
    caplog.set_level(logging.DEBUG, logger="loom_runtime")
    try:
        async with app:
            await clock.advance(1)  # the service is serving before the store goes down
            for _ in range(2):
                timers.down = True
                for _ in range(100):
                    await clock.advance(1)
                timers.down = False
                await clock.advance(1)
    finally:
        await storage.close()
    assert timers.failed >= 200  # every poll of both outages met it
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    reports = [m for level, m in lines if level == logging.ERROR]
    assert reports == ["the store is down (a test's outage)"] * 2
    answered = [m for level, m in lines if level == logging.INFO]
    assert len(answered) == 2
    assert all("the timer service's polls answer again" in m for m in answered)
    assert all("100 failed" in m for m in answered)


async def test_an_outage_met_again_at_the_next_entry_is_reported_again() -> None:
    """The app is left while the store is down, and entered again before it is back: the
    new entry's first failing poll is reported, as the first entry's was; the outage
    the app was left in is not taken to go on across the entries."""
    base = await open_storage("memory://")
    timers = OutageTimers(base.timers)
    storage = Storage(base.events, timers, base.leases, url=base.url, on_close=base.close)
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n1", clock=clock, recover=False, on_error=errors.append)
    timers.down = True
    reported: list[int] = []
    try:
        for _ in range(2):
            async with app:
                for _ in range(3):
                    await clock.advance(1)
                reported.append(len(errors))
    finally:
        await storage.close()
    assert reported == [1, 2]
    assert timers.failed >= 6
    assert all(isinstance(e, StorageUnavailableError) for e in errors)


async def test_an_outage_at_entry_on_a_virtual_clock_is_reported_once() -> None:
    """On the test kit's clock the service first lists every row written (to tell the
    clock when they fall due): with the store down at entry, that listing and the polls
    after it are one outage, reported once, as on the wall clock."""
    base = await open_storage("memory://")
    timers = OutageTimers(base.timers)
    storage = Storage(base.events, timers, base.leases, url=base.url, on_close=base.close)
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n1", clock=clock, recover=False, on_error=errors.append)
    timers.down = True
    try:
        async with app:
            for _ in range(3):
                await clock.advance(1)
    finally:
        await storage.close()
    assert timers.failed >= 3
    assert len(errors) == 1
