"""Cancel, continue-as-new, refusals of bad input, the observability hooks, and what
``drain`` waits for."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import warnings
from datetime import datetime, timedelta

import pytest
from loom_runtime import (
    ActionDeniedError,
    Context,
    ContextOutsideBodyError,
    ExecutionCancelledError,
    InvalidDurationError,
    Loom,
    NotJsonError,
    ReservedExecutionIdError,
    Retry,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from loom_runtime.testing import VirtualClock, check_replay, crash_at
from store_probes import ForwardingTimers, kinds, wired

from loom_core import (
    Event,
    EventKind,
    ExecutionNotFoundError,
    InvalidInputError,
    NewEvent,
    Storage,
    TimerRecord,
    TimerStore,
    open_storage,
)


async def test_cancel_a_parked_execution_through_the_fence(app: Loom) -> None:
    @app.workflow()
    async def waiting(ctx: Context) -> None:
        await ctx.sleep(timedelta(hours=1))

    handle = await app.start(waiting, id="c")
    await app.drain()
    assert await app.cancel("c", reason="customer") is True
    with pytest.raises(ExecutionCancelledError, match="customer"):
        await handle.result(timeout=5)
    log = await app.storage.events.read("c")
    assert log[-1].kind == EventKind.EXECUTION_CANCELLED
    assert log[-1].fence == 1  # written under the token the conditional acquire took
    assert await app.storage.timers.pending("c") == ()
    assert await app.cancel("c") is False


@pytest.mark.parametrize("where", ["this app", "another app"])
async def test_a_cancel_that_lands_as_the_body_writes_its_timer_row_leaves_no_row(
    where: str,
) -> None:
    """The cancel removes the execution's rows while the parking run is writing one: the
    run, stopped (a cancel here) or fenced out (a cancel elsewhere) at its park, removes
    the row it wrote once it sees the execution has ended."""
    async with open_storage("memory://") as storage:
        writing, written = asyncio.Event(), asyncio.Event()
        schedule = storage.timers.schedule

        async def held(row: TimerRecord) -> None:
            if not written.is_set():
                writing.set()
                await written.wait()
            await schedule(row)

        storage.timers.schedule = held  # type: ignore[method-assign,assignment]
        app = Loom(storage, node="n", timers=False, recover=False)
        other = Loom(storage, node="m", timers=False, recover=False)

        @other.workflow(name="waits")
        @app.workflow(name="waits")
        async def waits(ctx: Context) -> object:
            return await ctx.receive("never", timeout=3600)

        async with app, other:
            handle = await app.start(waits, id="x")
            await writing.wait()  # the body writes its timeout's row
            canceller = app if where == "this app" else other
            assert await canceller.cancel("x", reason="test") is True
            written.set()  # the row lands after the cancel removed the rows
            await app.drain()
            with pytest.raises(ExecutionCancelledError):
                await handle.result(timeout=5)
            assert await storage.timers.pending("x") == ()


async def test_cancel_a_running_execution_stops_it_at_its_next_durable_call(app: Loom) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    after: list[str] = []

    async def long_step() -> str:
        entered.set()
        await release.wait()
        return "done"

    async def next_step() -> None:
        after.append("ran")

    @app.workflow()
    async def busy(ctx: Context) -> None:
        await ctx.step(long_step)
        await ctx.step(next_step)

    handle = await app.start(busy, id="busy")
    await entered.wait()
    assert await app.cancel("busy", reason="stop") is True
    release.set()
    await app.drain()
    assert after == []
    assert await handle.status() == "cancelled"
    kinds = [e.kind for e in await app.storage.events.read("busy")]
    assert kinds == [EventKind.EXECUTION_STARTED, EventKind.EXECUTION_CANCELLED]


async def test_continue_as_new_names_its_successor_and_the_handle_follows(app: Loom) -> None:
    @app.workflow()
    async def countdown(ctx: Context, n: int) -> str:
        if n > 0:
            ctx.continue_as_new(n - 1)
        return "liftoff"

    handle = await app.start(countdown, 2, id="cd")
    assert await handle.result(timeout=5) == "liftoff"
    assert await handle.status() == "continued"
    first = await app.inspect("cd")
    assert first.successor == "cd#1"
    second = await app.inspect("cd#1")
    assert (second.continued_from, second.successor, second.input) == ("cd", "cd#2", [1])
    assert (await app.inspect("cd#2")).status == "completed"
    assert sorted(await check_replay(app)) == ["cd", "cd#1", "cd#2"]


async def test_a_step_waiting_to_retry_makes_no_attempt_after_a_cancel(
    app: Loom, clock: VirtualClock
) -> None:
    attempts: list[float] = []

    async def flaky() -> None:
        attempts.append(clock.now().timestamp())
        raise ConnectionError("down")

    @app.workflow()
    async def retrying(ctx: Context) -> None:
        await ctx.step(flaky, retry=Retry(attempts=5, initial_interval=10, backoff=1))

    handle = await app.start(retrying, id="r")
    await clock.advance(0)
    assert len(attempts) == 1  # the first attempt failed; the next is due in 10 s
    assert await app.cancel("r") is True
    async with asyncio.timeout(5):  # a bound for a failing test, not a measurement
        await app.drain()  # the run stopped: drain does not wait out the interval
    await clock.advance(60)
    assert len(attempts) == 1
    assert await handle.status() == "cancelled"


async def test_a_step_retrying_in_another_process_stops_at_its_next_attempt_after_a_cancel(
) -> None:
    """The cancel is written by another app on the same store (another process): the run
    reads its log between attempts and stops, rather than repeat the step's effects."""
    clock = VirtualClock()
    attempts: list[float] = []

    async def flaky() -> None:
        attempts.append(clock.now().timestamp())
        raise ConnectionError("down")

    async def retrying(ctx: Context) -> None:
        await ctx.step(flaky, retry=Retry(attempts=5, initial_interval=10, backoff=1))

    async with open_storage("memory://") as storage:
        worker = Loom(storage, node="worker", clock=clock, random=random.Random(1))
        worker.workflow(name="retrying")(retrying)
        async with worker, Loom(storage, node="ops", timers=False, recover=False) as ops:
            await worker.start("retrying", id="r")
            await clock.advance(0)
            assert len(attempts) == 1
            assert await ops.cancel("r") is True
            await clock.advance(60)
            await worker.drain()
            assert len(attempts) == 1
            assert (await worker.inspect("r")).status == "cancelled"


async def test_cancelling_an_execution_that_continued_cancels_its_live_successor(
    app: Loom,
) -> None:
    @app.workflow()
    async def rounds(ctx: Context, n: int) -> object:
        if n < 2:
            ctx.continue_as_new(n + 1)
        return await ctx.receive("stop")

    handle = await app.start(rounds, 0, id="r")
    await app.drain()
    assert await app.get("r#2").status() == "suspended"
    assert await app.cancel("r", reason="operator") is True  # the id the caller knows
    assert await app.get("r#2").status() == "cancelled"
    with pytest.raises(ExecutionCancelledError):
        await handle.result(timeout=5)
    assert await app.cancel("r") is False
    assert [await app.get(i).status() for i in ("r", "r#1")] == ["continued", "continued"]


async def test_bad_input_is_refused_with_a_typed_error_and_nothing_appended(
    app: Loom,
) -> None:
    @app.workflow()
    async def echo(ctx: Context, value: object) -> object:
        return value

    with pytest.raises(NotJsonError, match="the input of workflow"):
        await app.start(echo, object(), id="bad-input")
    with pytest.raises(ReservedExecutionIdError):
        await app.start(echo, 1, id="$mine")
    with pytest.raises(WorkflowNotFoundError, match="'nope'"):
        await app.start("nope", 1, id="no-such")

    async def stray(ctx: Context) -> None:
        return None

    with pytest.raises(WorkflowNotFoundError):
        await app.start(stray, id="unregistered")
    assert await app.storage.events.list_executions() == ()


async def test_a_result_that_is_not_json_fails_the_execution_with_the_reason(
    app: Loom,
) -> None:
    @app.workflow()
    async def returns_a_set(ctx: Context) -> object:
        return {1, 2}

    handle = await app.start(returns_a_set, id="set")
    with pytest.raises(WorkflowFailedError, match="NotJsonError"):
        await handle.result(timeout=5)


async def test_bad_durations_are_refused_inside_the_body_before_anything_is_written(
    app: Loom,
) -> None:
    refused: list[str] = []

    @app.workflow()
    async def careless(ctx: Context) -> list[str]:
        for attempt in (
            lambda: ctx.sleep(-1),
            lambda: ctx.sleep_until(datetime(2030, 1, 1)),  # naive
            lambda: ctx.receive("t", timeout=-5),
            lambda: ctx.sleep("soon"),  # type: ignore[arg-type]
        ):
            try:
                attempt()
            except InvalidDurationError as exc:
                refused.append(type(exc).__name__)
        return refused

    handle = await app.start(careless, id="durations")
    assert await handle.result(timeout=5) == ["InvalidDurationError"] * 4
    kinds = [e.kind for e in await app.storage.events.read("durations")]
    assert kinds == [EventKind.EXECUTION_STARTED, EventKind.EXECUTION_COMPLETED]


async def test_an_unknown_workflow_on_resume_is_refused_naming_it_and_takes_no_token() -> None:
    async with open_storage("memory://") as storage:
        first = Loom(storage, node="n", recover=False, clock=VirtualClock())

        @first.workflow(name="renamed-away")
        async def sleeper(ctx: Context) -> None:
            await ctx.sleep(60)

        async with first:
            await first.start(sleeper, id="s")
            await first.drain()
        before = await storage.events.read("s")
        view_park = next(e for e in before if e.kind == EventKind.EXECUTION_SUSPENDED)
        second = Loom(storage, node="n", recover=False, clock=VirtualClock())
        async with second:
            with pytest.raises(WorkflowNotFoundError, match="'renamed-away'"):
                await second.resume("s", fence_if_parked_at=view_park.sequence)
        assert await storage.events.read("s") == before
        # No token was taken: the park's own token (0) still wins the conditional acquire.
        won = await storage.events.acquire_fence_if("s", fence=0, park_seq=view_park.sequence)
        assert won.acquired


async def test_hooks_fire_before_and_after_the_durable_write() -> None:
    seen: list[tuple[str, str]] = []

    def on_event(execution_id: str, event: NewEvent) -> None:
        seen.append(("before", event.kind))

    def on_durable_event(event: Event) -> None:
        seen.append(("after", event.kind))

    app = Loom("memory://", node="n", on_event=on_event, on_durable_event=on_durable_event)
    async with app:

        @app.workflow()
        async def tiny(ctx: Context) -> int:
            return 1

        await (await app.start(tiny, id="h")).result(timeout=5)
    assert seen == [
        ("before", EventKind.EXECUTION_STARTED),
        ("after", EventKind.EXECUTION_STARTED),
        ("before", EventKind.EXECUTION_COMPLETED),
        ("after", EventKind.EXECUTION_COMPLETED),
    ]


async def test_each_answer_to_a_park_is_heard_of_once_before_its_write() -> None:
    """A resume builds its answer once to refuse before any token is taken and again to
    write it: ``on_event`` hears only of the one written."""
    before: list[str] = []
    after: list[str] = []
    app = Loom(
        "memory://", node="n", clock=VirtualClock(),
        on_event=lambda execution_id, event: before.append(event.kind),
        on_durable_event=lambda event: after.append(event.kind),
    )

    @app.workflow(name="naps-then-waits")
    async def naps_then_waits(ctx: Context) -> object:
        await ctx.sleep(60)
        return await ctx.receive("go")

    async with app:
        handle = await app.start(naps_then_waits, id="w")
        await app.drain()
        await app.clock.advance(60)  # type: ignore[attr-defined]
        await app.drain()
        await app.send("w", "go", 1)
        assert await handle.result(timeout=5) == 1
        logged = [e.kind for e in await app.storage.events.read("w")]
    assert before == after == logged
    assert logged.count(EventKind.EXECUTION_RESUMED) == 2


async def test_the_hooks_hear_of_what_the_app_writes_itself() -> None:
    """A cancel (of a parked and of a running execution), a denial and a takeover are
    written by the app, not a run: the hooks hear of them as of a run's writes, and every
    event the durable hook reports is one the log holds."""
    seen: list[tuple[str, str, str]] = []
    durable: list[Event] = []

    def on_event(execution_id: str, event: NewEvent) -> None:
        seen.append(("before", execution_id, event.kind))

    def on_durable_event(event: Event) -> None:
        seen.append(("after", event.execution_id, event.kind))
        durable.append(event)

    def admins(principal: object, action: str, execution_id: str) -> bool:
        return principal in (None, "admin")

    entered = [asyncio.Event(), asyncio.Event()]  # the first run's, its takeover's

    async def hang() -> None:
        entered[1 if entered[0].is_set() else 0].set()
        await asyncio.Event().wait()

    async with open_storage("memory://") as storage:
        first = Loom(storage, node="n", clock=VirtualClock(), timers=False)

        @first.workflow(name="stuck")
        async def stuck(ctx: Context) -> None:
            await ctx.step(hang)

        async with first:
            await first.start(stuck, id="r")
            await entered[0].wait()
        app = Loom(
            storage, node="n", clock=VirtualClock(), authorize=admins, on_event=on_event,
            on_durable_event=on_durable_event,
        )
        app.workflow(name="stuck")(stuck)

        @app.workflow(name="parked")
        async def parked(ctx: Context) -> object:
            return await ctx.receive("never")

        async with app:
            handle = await app.start(parked, id="p")
            await entered[1].wait()  # the takeover's run hangs in the step: no drain
            for _ in range(1000):
                if await handle.status() == "suspended":
                    break
                await asyncio.sleep(0)
            assert await handle.status() == "suspended"
            with pytest.raises(ActionDeniedError):
                await app.cancel("p", principal="mallory")
            assert await app.cancel("p", reason="done with it")
            assert await app.cancel("r", reason="stuck")  # running: its takeover's run
        wanted = [
            (EventKind.EXECUTION_RECOVERED, "r"),
            (EventKind.EXECUTION_DENIED, "p"),
            (EventKind.EXECUTION_CANCELLED, "p"),
            (EventKind.EXECUTION_CANCELLED, "r"),
        ]
        for kind, execution_id in wanted:
            assert ("before", execution_id, kind) in seen
            assert ("after", execution_id, kind) in seen
        for event in durable:
            assert event in await storage.events.read(event.execution_id)


async def test_a_denied_cancel_is_recorded_unfenced_and_refused() -> None:
    def only_admins(principal: object, action: str, execution_id: str) -> bool:
        return principal == "admin"

    app = Loom("memory://", node="n", authorize=only_admins, clock=VirtualClock())
    async with app:

        @app.workflow()
        async def long(ctx: Context) -> None:
            await ctx.sleep(60)

        handle = await app.start(long, id="d")
        await app.drain()
        with pytest.raises(ActionDeniedError, match="'mallory' may not cancel 'd'"):
            await app.cancel("d", principal="mallory")
        log = await app.storage.events.read("d")
        assert log[-1].kind == EventKind.EXECUTION_DENIED
        assert "fence" not in log[-1].metadata
        assert await handle.status() == "suspended"

        class Opaque:
            def __repr__(self) -> str:
                raise RuntimeError("no repr")

        # A principal the hook refuses is the caller's object: one whose repr fails (or an
        # int of more digits than Python converts) is still refused, and recorded, typed.
        for principal in (Opaque(), 10**5000):
            with pytest.raises(ActionDeniedError, match="whose repr"):
                await app.cancel("d", principal=principal)
        assert [e.kind for e in (await app.storage.events.read("d"))[-2:]] == [
            EventKind.EXECUTION_DENIED,
            EventKind.EXECUTION_DENIED,
        ]
        assert await app.cancel("d", principal="admin") is True


def test_options_are_checked_when_the_app_is_built() -> None:
    with pytest.raises(InvalidInputError):
        Loom("memory://", node="")
    with pytest.raises(InvalidInputError):
        Loom("memory://", poll_interval=0)
    with pytest.raises(InvalidInputError):
        Loom(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"poll_interval": float("inf")}, "finite number of seconds"),
        ({"poll_interval": float("nan")}, "finite number of seconds"),
        ({"timers": "no"}, r"timers=\.\.\.\) must be True or False"),
        ({"recover": 0}, r"recover=\.\.\.\) must be True or False"),
        ({"decorators": "tenant"}, "a list of decorator specs"),
        ({"node": "web\x001"}, r"node=\.\.\.\) 'web\\x001' contains U\+0000"),
        ({"node": "\ud800"}, "lone surrogate"),
    ],
)
def test_options_a_user_gets_wrong_are_refused_when_the_app_is_built(
    options: dict[str, object], says: str
) -> None:
    with pytest.raises(InvalidInputError, match=says):
        Loom("memory://", **options)  # type: ignore[arg-type]


async def test_decorators_none_is_no_decorator() -> None:
    async with Loom("memory://", decorators=None) as app:

        @app.workflow()
        async def plain(ctx: Context) -> int:
            return 1

        assert await app.execute(plain) == 1


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1, "5", 10**400])
async def test_a_result_timeout_that_is_no_number_of_seconds_is_refused(
    app: Loom, seconds: object
) -> None:
    with pytest.raises(InvalidInputError, match="timeout="):
        await app.get("x").result(timeout=seconds)  # type: ignore[arg-type]


def test_an_app_left_at_once_leaves_no_coroutine_unawaited() -> None:
    async def enter_and_leave() -> None:
        async with Loom("memory://"):
            pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(enter_and_leave())
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


async def test_drain_waits_for_a_parked_run_that_answers_its_own_park_and_drives_on() -> None:
    # Two zero-length sleeps in a gather park the run with both waits due; the task that
    # drove it then answers its own park and drives on. The conditional acquire of that
    # answer is held until the test lets it go: drain must not return meanwhile.
    async with wired() as w:

        @w.app.workflow()
        async def twice(ctx: Context) -> str:
            await ctx.gather(ctx.sleep(0), ctx.sleep(0))
            return "done"

        reached, gate = asyncio.Event(), asyncio.Event()

        async def hold(execution_id: str) -> None:
            reached.set()
            await gate.wait()

        w.probe.before_acquire = hold
        handle = await w.app.start(twice, id="twice")
        await reached.wait()
        assert [e.kind for e in await w.base.events.read("twice")][-1] == (
            EventKind.EXECUTION_SUSPENDED
        )
        drained = asyncio.ensure_future(w.app.drain())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not drained.done(), "drain returned while the run was answering its own park"
        gate.set()
        await drained
        assert await handle.status() == "completed"


class _SwallowingTimers(ForwardingTimers):
    """A timer store whose first ``due`` waits, and swallows the cancellation that reaches
    it there and returns, as Python 3.11's ``asyncio.wait_for`` does when the result it
    waits for (a free pooled connection, say) arrives together with the cancellation."""

    def __init__(self, inner: TimerStore) -> None:
        super().__init__(inner)
        self.waiting = asyncio.Event()
        self.swallowed = 0

    async def due(
        self, now: datetime, *, limit: int = 100, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        if not self.swallowed:
            self.waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.swallowed += 1
        return await self.inner.due(now, limit=limit, redrive=redrive)


async def test_leaving_the_app_stops_a_service_that_swallowed_its_cancellation() -> None:
    """The timer service swallows the cancellation of leaving the app (in a store call,
    as a driver on Python 3.11 can) and polls on: leaving cancels it again until it ends,
    rather than waiting for it for ever."""
    base = await open_storage("memory://")
    timers = _SwallowingTimers(base.timers)
    storage = Storage(base.events, timers, base.leases, url=base.url, on_close=base.close)
    app = Loom(storage, node="n1", recover=False, poll_interval=0.001)

    async def serve_then_leave() -> None:
        async with app:
            await timers.waiting.wait()  # the service is inside the store call

    try:
        # A guard, not a measurement: without the second cancellation this never ends.
        await asyncio.wait_for(serve_then_leave(), timeout=60)
    finally:
        await storage.close()
    assert timers.swallowed == 1


async def test_a_ctx_kept_after_its_body_ended_is_refused_naming_the_mistake(app: Loom) -> None:
    kept: list[Context] = []

    async def one() -> int:
        return 1

    @app.workflow()
    async def leaks(ctx: Context) -> int:
        kept.append(ctx)
        return 1

    assert await app.execute(leaks, id="k") == 1
    (ctx,) = kept
    for call in (lambda: ctx.step(one), ctx.now, lambda: ctx.sleep(1), lambda: ctx.patched("p")):
        with pytest.raises(ContextOutsideBodyError, match="outside its workflow's body"):
            call()


async def test_leaving_the_app_with_runs_in_progress_says_which_it_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with await open_storage("memory://") as storage:
        app = Loom(storage, node="script-1", timers=False, recover=False)
        in_step = asyncio.Event()

        async def forever() -> None:
            in_step.set()
            await asyncio.Event().wait()

        @app.workflow()
        async def slow(ctx: Context) -> None:
            await ctx.step(forever)

        async with app:
            await app.start(slow, id="s-1")
            await in_step.wait()
            caplog.set_level(logging.WARNING, logger="loom_runtime")
        (record,) = [r for r in caplog.records if r.name == "loom_runtime"]
        assert "leaves 1 running execution(s) of node 'script-1'" in record.getMessage()
        assert "'s-1'" in record.getMessage()
        assert "app.drain()" in record.getMessage()
        # Left for the node's next start, as an exit leaves it.
        assert [e.kind for e in await storage.events.read("s-1")] == [
            EventKind.EXECUTION_STARTED
        ]


async def test_drain_right_after_entering_waits_for_the_recovery_on_entry() -> None:
    async with await open_storage("memory://") as storage:
        first = Loom(storage, node="web-1", clock=VirtualClock(), recover=False)
        ran: list[str] = []

        async def charge() -> str:
            ran.append("charge")
            return "charged"

        async def order(ctx: Context) -> object:
            return await ctx.step(charge)

        first.workflow(name="order")(order)
        async with first:
            crash_at(first, step="charge", when="before")
            await first.start("order", id="o")
            await first.drain()
        assert ran == []  # left running under web-1, as by a process that died

        restarted = Loom(storage, node="web-1", clock=VirtualClock())
        restarted.workflow(name="order")(order)
        async with restarted:
            await restarted.drain()  # the recovery on entering has taken the run over
            assert await restarted.get("o").status() == "completed"
        assert ran == ["charge"]


async def test_authorize_is_asked_about_callers_actions_not_the_runtimes_own_answers() -> None:
    """A due timer and a message's delivery answer a park too, but no caller acts: the
    hook that guards resume and cancel is not asked about them, so they are neither
    refused nor recorded as denied."""
    asked: list[tuple[object, str, str]] = []

    def only_ops(principal: object, action: str, execution_id: str) -> bool:
        asked.append((principal, action, execution_id))
        return principal == "ops"

    clock = VirtualClock()
    app = Loom("memory://", node="n", authorize=only_ops, clock=clock)

    @app.workflow(name="nap_then_listen")
    async def nap_then_listen(ctx: Context) -> object:
        await ctx.sleep(0)  # due when parked: the run answers its own park
        await ctx.sleep(60)
        return await ctx.receive("go")

    async with app:
        handle = await app.start(nap_then_listen, id="w")
        await app.drain()
        await clock.advance(60)
        await app.drain()
        assert await handle.status() == "suspended"
        await app.send("w", "go", "went")
        assert await handle.result(timeout=5) == "went"
        log = await app.storage.events.read("w")
        assert EventKind.EXECUTION_DENIED not in [e.kind for e in log]
        assert asked == []


async def test_a_cancel_reason_no_store_can_hold_is_refused_before_any_token_is_taken() -> None:
    entered, gate = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        entered.set()
        await gate.wait()
        return "slow"

    app = Loom("memory://", node="n", clock=VirtualClock())

    @app.workflow(name="busy")
    async def busy(ctx: Context) -> str:
        return await ctx.step(slow)

    async with app:
        handle = await app.start(busy, id="b")
        await entered.wait()
        for reason in ("bad\x00reason", "lone \ud800 surrogate"):
            with pytest.raises(InvalidInputError, match="reason="):
                await app.cancel("b", reason=reason)
        gate.set()
        assert await handle.result(timeout=5) == "slow"
        log = await app.storage.events.read("b")
        assert {e.fence for e in log} == {0}  # no token was taken: the run was not fenced out
        assert await app.cancel("b", reason="") is False  # finished; an empty reason is fine


async def test_a_refused_cancel_tells_the_caller_nothing_of_the_execution() -> None:
    """``authorize`` is asked before the execution is looked at: a caller it refuses
    gets ActionDeniedError from a cancel or a resume whether the id is unknown, finished
    or running, and only a running execution's log records the refusals."""

    def only_admins(principal: object, action: str, execution_id: str) -> bool:
        return principal == "admin"

    app = Loom("memory://", node="n", authorize=only_admins, clock=VirtualClock())

    @app.workflow(name="quick")
    async def quick(ctx: Context) -> str:
        return "done"

    @app.workflow(name="slow")
    async def slow(ctx: Context) -> None:
        await ctx.sleep(60)

    async with app:
        await app.execute(quick, id="finished")
        await app.start(slow, id="parked")
        await app.drain()
        for execution_id in ("unknown", "finished", "parked"):
            denied = f"'mallory' may not cancel '{execution_id}'"
            with pytest.raises(ActionDeniedError, match=denied):
                await app.cancel(execution_id, principal="mallory")
            with pytest.raises(ActionDeniedError):  # nor by a resume
                await app.resume(execution_id, fence_if_parked_at=1, principal="mallory")
        assert await app.storage.events.head("unknown") == 0
        assert [e.kind for e in await app.storage.events.read("finished")][-1] == (
            EventKind.EXECUTION_COMPLETED
        )
        assert [e.kind for e in await app.storage.events.read("parked")][-2:] == [
            EventKind.EXECUTION_DENIED, EventKind.EXECUTION_DENIED
        ]
        with pytest.raises(ExecutionNotFoundError):
            await app.cancel("unknown", principal="admin")
        assert await app.cancel("finished", principal="admin") is False


def test_a_coroutine_function_as_a_hook_is_refused_when_the_app_is_built() -> None:
    """Hooks are called on the event loop and not awaited: an ``async def on_error``
    would never run (its coroutine dropped), so it is refused, saying what to do."""

    async def alert(error: BaseException) -> None:
        raise AssertionError("never awaited")

    class AsyncHook:
        async def __call__(self, error: BaseException) -> None:
            raise AssertionError("never awaited")

    for hook in (alert, AsyncHook()):
        with pytest.raises(InvalidInputError, match="not a coroutine function"):
            Loom("memory://", on_error=hook)


async def test_a_hook_that_returns_a_coroutine_is_reported_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def alert(event: Event) -> None:
        raise AssertionError("never awaited")

    app = Loom("memory://", node="n", clock=VirtualClock(), on_durable_event=lambda e: alert(e))

    @app.workflow(name="quick")
    async def quick(ctx: Context) -> str:
        return "done"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited" left behind
        async with app:
            assert await app.execute(quick, id="q") == "done"
        gc.collect()
    assert "the on_durable_event hook returned a coroutine" in caplog.text


class _HookBroke(BaseException):
    """A BaseException that is not an Exception, of a hook's own."""


@pytest.mark.parametrize("hook", ["on_event", "on_durable_event"])
async def test_a_hook_that_raises_a_base_exception_of_its_own_breaks_no_run(
    hook: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Logged like any error a hook raises (the run stopped, reported as its body's)."""

    def broken(*args: object) -> None:
        raise _HookBroke("the hook's own")

    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", clock=VirtualClock(), **{hook: broken})  # type: ignore[arg-type]

        @app.workflow(name="two-steps")
        async def two_steps(ctx: Context) -> str:
            await ctx.step(lambda: 1, name="a")
            await ctx.step(lambda: 2, name="b")
            return "done"

        async with app:
            assert await app.execute(two_steps, id="t") == "done"
            logged = await kinds(storage.events, "t")
    assert logged == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_COMPLETED,
    ]
    assert f"the {hook} hook raised; the run goes on" in caplog.text


async def test_a_hook_that_changes_its_event_changes_neither_the_log_nor_the_run() -> None:
    """Each hook is handed its own copy: ``on_event`` runs before the write, and
    ``on_durable_event`` before the run hands its result to the caller."""

    def on_event(execution_id: str, event: NewEvent) -> None:
        payload = event.payload
        assert isinstance(payload, dict)
        for field in ("input", "result"):
            value = payload.get(field)
            if isinstance(value, list):
                value.append("from on_event")
            if isinstance(value, dict):
                value["from"] = "on_event"

    def on_durable_event(event: Event) -> None:
        payload = event.payload
        assert isinstance(payload, dict)
        value = payload.get("result")
        if isinstance(value, dict):
            value["from"] = "on_durable_event"

    def quote(order: str) -> dict[str, object]:
        return {"order": order, "lines": [1, 2]}

    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", on_event=on_event, on_durable_event=on_durable_event)

        @app.workflow(name="priced")
        async def priced(ctx: Context, order: str) -> object:
            return {"quote": await ctx.step(quote, order)}

        async with app:
            assert await app.execute(priced, "o-1", id="q") == {
                "quote": {"order": "o-1", "lines": [1, 2]}
            }
        payloads = [e.payload for e in await storage.events.read("q")]
    assert payloads[0]["input"] == ["o-1"]  # type: ignore[call-overload,index]
    assert payloads[1]["result"] == {"order": "o-1", "lines": [1, 2]}  # type: ignore[call-overload,index]
    assert payloads[2]["result"] == {"quote": {"order": "o-1", "lines": [1, 2]}}  # type: ignore[call-overload,index]


async def test_leaving_the_app_stops_a_run_whose_step_swallowed_its_cancellation() -> None:
    """Leaving stops every run where it is, as an exit would: a step that catches the
    cancellation and returns must not let its run record it and go on to the next step."""
    storage = await open_storage("memory://")
    app = Loom(storage, node="n1")
    in_step = asyncio.Event()
    charged: list[str] = []

    async def stubborn() -> str:
        in_step.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "late"  # swallowed
        return "never"

    def charge() -> str:
        charged.append("charge")
        return "charged"

    @app.workflow()
    async def flow(ctx: Context) -> list[str]:
        return [await ctx.step(stubborn), await ctx.step(charge)]

    try:
        async with app:
            await app.start(flow, id="f")
            await in_step.wait()
        assert charged == []
        assert await kinds(storage.events, "f") == [EventKind.EXECUTION_STARTED]
    finally:
        await storage.close()


async def test_a_hook_that_raises_at_every_event_logs_each_bug_once_then_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hook bug met at every event is logged with its traceback once per place it
    raises from and type of error, its repeats at DEBUG, and a line counting them at the
    10th, 100th, 1000th...: seen, without a traceback per event."""
    seen = [0]

    def on_durable_event(event: Event) -> None:
        seen[0] += 1
        if event.kind == EventKind.EXECUTION_COMPLETED:
            raise ValueError("no handler for the end")  # another bug, in another place
        raise KeyError(event.kind)

    caplog.set_level(logging.DEBUG, logger="loom_runtime")
    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", clock=VirtualClock(), on_durable_event=on_durable_event)

        @app.workflow(name="many")
        async def many(ctx: Context, n: int) -> int:
            for i in range(n):
                await ctx.step(lambda: 1, name=f"s{i}")
            return n

        async with app:
            assert await app.execute(many, 150, id="m") == 150
            assert await app.execute(many, 1, id="m2") == 1
    assert seen[0] == 155
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    first = [r for r in errors if r.exc_info is not None]
    assert [type(r.exc_info[1]) for r in first if r.exc_info] == [KeyError, ValueError]
    assert all("the on_durable_event hook raised" in r.getMessage() for r in errors)
    counted = [r.getMessage() for r in errors if r.exc_info is None]
    assert len(counted) == 2  # KeyError's 10th and 100th
    assert "KeyError" in counted[0]
    assert "10 times" in counted[0]
    assert "100 times" in counted[1]


async def test_a_hook_that_returns_a_coroutine_at_every_event_is_logged_once_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def alert(event: Event) -> None:
        raise AssertionError("never awaited")

    app = Loom("memory://", node="n", clock=VirtualClock(), on_durable_event=lambda e: alert(e))

    @app.workflow(name="steps")
    async def steps(ctx: Context) -> str:
        for i in range(20):
            await ctx.step(lambda: 1, name=f"s{i}")
        return "done"

    async with app:
        assert await app.execute(steps, id="s") == "done"
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [
        "the on_durable_event hook returned a coroutine, which is not awaited",
        "the on_durable_event hook returned a coroutine again, which is not awaited: 10 "
        "times so far",
    ]
