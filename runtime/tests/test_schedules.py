"""``@app.scheduled``: a workflow started at each instant of a cron expression or an
interval, once per instant however many nodes serve it, with nothing stored but the
executions it starts."""

from __future__ import annotations

import asyncio
import logging
import sys
import textwrap
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from loom_runtime import Context, Loom, Retry
from loom_runtime.schedules import Schedule, tick_id
from loom_runtime.testing import ChildProcess, VirtualClock, check_replay

from loom_core import EventKind, InvalidOptionError, LoomError, Storage, open_storage

START = datetime(2030, 1, 1, tzinfo=UTC)  # where a VirtualClock starts


@pytest.fixture
async def storage() -> AsyncIterator[Storage]:
    async with open_storage("memory://") as opened:
        yield opened


async def started(app: Loom) -> list[tuple[str, object, str | None]]:
    """Every execution: its id, its input and its status."""
    return [(v.execution_id, v.input, v.status) async for v in app.executions()]


async def test_an_interval_starts_the_workflow_at_each_instant_with_the_instant(
    app: Loom, clock: VirtualClock
) -> None:
    @app.scheduled(every=timedelta(minutes=1))
    @app.workflow(name="sweep")
    async def sweep(ctx: Context, scheduled_at: str) -> str:
        return f"swept at {scheduled_at}"

    await clock.advance(59)
    assert await started(app) == []
    await clock.advance(1)
    assert await started(app) == [
        ("sweep@2030-01-01T00:01:00Z", ["2030-01-01T00:01:00+00:00"], "completed")
    ]
    assert await app.get("sweep@2030-01-01T00:01:00Z").result(timeout=5) == (
        "swept at 2030-01-01T00:01:00+00:00"
    )
    await clock.advance(120)
    assert [e for e, _, _ in await started(app)] == [
        "sweep@2030-01-01T00:01:00Z",
        "sweep@2030-01-01T00:02:00Z",
        "sweep@2030-01-01T00:03:00Z",
    ]


async def test_a_cron_expression_gives_the_instants(app: Loom, clock: VirtualClock) -> None:
    @app.scheduled(cron="*/5 9-10 * * *", name="poll")
    @app.workflow()
    async def poll(ctx: Context, scheduled_at: str) -> None:
        return None

    await clock.advance(timedelta(hours=9, minutes=11))
    assert [e for e, _, _ in await started(app)] == [
        "poll@2030-01-01T09:00:00Z",
        "poll@2030-01-01T09:05:00Z",
        "poll@2030-01-01T09:10:00Z",
    ]
    assert app.schedules["poll"] == Schedule("poll", app_workflow_name(app), cron="*/5 9-10 * * *")


def app_workflow_name(app: Loom) -> str:
    (name,) = app.workflows
    return name


async def test_two_nodes_start_each_instant_once(storage: Storage) -> None:
    clock = VirtualClock()
    runs: list[str] = []

    async def hourly(ctx: Context, scheduled_at: str) -> None:
        runs.append(scheduled_at)

    a = Loom(storage, node="a", clock=clock)
    b = Loom(storage, node="b", clock=clock)
    for app in (a, b):
        app.scheduled(every=3600)(app.workflow(name="hourly")(hourly))
    async with a, b:
        await clock.advance(timedelta(hours=3))
        assert [e for e, _, _ in await started(a)] == [
            "hourly@2030-01-01T01:00:00Z",
            "hourly@2030-01-01T02:00:00Z",
            "hourly@2030-01-01T03:00:00Z",
        ]
        for execution_id, _, _ in await started(a):
            kinds = [e.kind for e in await storage.events.read(execution_id)]
            assert kinds.count(EventKind.EXECUTION_STARTED) == 1
    assert sorted(runs) == [
        "2030-01-01T01:00:00+00:00",
        "2030-01-01T02:00:00+00:00",
        "2030-01-01T03:00:00+00:00",
    ]


async def test_instants_that_pass_while_no_node_serves_are_not_made_up_for(
    storage: Storage,
) -> None:
    clock = VirtualClock()

    async def tick(ctx: Context, scheduled_at: str) -> None:
        return None

    def app() -> Loom:
        loom = Loom(storage, node="n", clock=clock)
        loom.scheduled(every=60)(loom.workflow(name="tick")(tick))
        return loom

    async with app() as first:
        await clock.advance(60)
        assert len(await started(first)) == 1
    await clock.advance(600)  # ten instants pass with no node up
    async with app() as again:
        await clock.advance(0)
        assert len(await started(again)) == 1
        await clock.advance(60)
        assert [e for e, _, _ in await started(again)][-1] == "tick@2030-01-01T00:12:00Z"
        assert len(await started(again)) == 2


async def test_an_app_that_serves_no_timers_starts_nothing(storage: Storage) -> None:
    clock = VirtualClock()
    app = Loom(storage, node="n", clock=clock, timers=False)

    @app.scheduled(every=1)
    @app.workflow()
    async def often(ctx: Context, scheduled_at: str) -> None:
        return None

    async with app:
        await clock.advance(10)
        assert await started(app) == []


async def test_a_schedule_registered_while_the_app_runs_starts_serving(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow(name="late")
    async def late(ctx: Context, scheduled_at: str) -> None:
        return None

    await clock.advance(30)
    app.scheduled(every=60)(late)
    await clock.advance(30)
    assert [e for e, _, _ in await started(app)] == ["late@2030-01-01T00:01:00Z"]


async def test_another_workflow_at_an_instants_id_goes_to_on_error(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n", clock=clock, on_error=errors.append)

    @app.workflow()
    async def squatter(ctx: Context) -> str:
        return "here first"

    @app.scheduled(every=60, name="job")
    @app.workflow()
    async def job(ctx: Context, scheduled_at: str) -> None:
        return None

    async with app:
        await app.execute(squatter, id=tick_id("job", START + timedelta(minutes=1)))
        await clock.advance(120)
        assert [type(e).__name__ for e in errors] == ["ExecutionAlreadyExistsError"]
        assert [e for e, _, _ in await started(app)] == [
            "job@2030-01-01T00:01:00Z",
            "job@2030-01-01T00:02:00Z",
        ]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({}, "exactly one of cron= "),
        ({"cron": "* * * * *", "every": 60}, "exactly one of cron= "),
        ({"cron": "61 * * * *"}, "is not a cron expression"),
        ({"cron": "0 0 30 2 *"}, "is not a cron expression"),
        ({"cron": 5}, "cron= takes a cron expression"),
        ({"cron": "0 * * * * *"}, "five fields"),
        ({"every": 60, "name": "a\x00b"}, "schedule's name"),
        ({"every": 0.5}, "from 1 second to 1000 years"),
        ({"every": float("nan")}, "from 1 second to 1000 years"),
        ({"every": timedelta(days=366_000)}, "from 1 second to 1000 years"),
        ({"every": True}, "every= takes seconds"),
        ({"every": "60"}, "every= takes seconds"),
        ({"every": 60, "name": ""}, "non-empty str"),
        ({"every": 60, "name": "$job"}, "does not make execution ids"),
    ],
)
async def test_a_bad_schedule_is_refused_where_it_is_written(
    app: Loom, options: dict[str, object], says: str
) -> None:
    @app.workflow()
    async def job(ctx: Context, scheduled_at: str) -> None:
        return None

    with pytest.raises(InvalidOptionError, match=says):
        app.scheduled(**options)(job)  # type: ignore[arg-type]
    assert app.schedules == {}


async def test_the_workflow_must_be_registered_and_take_the_instant(app: Loom) -> None:
    async def unregistered(ctx: Context, scheduled_at: str) -> None:
        return None

    with pytest.raises(InvalidOptionError, match=r"above @app\.workflow"):
        app.scheduled(every=60)(unregistered)

    @app.workflow()
    async def no_argument(ctx: Context) -> None:
        return None

    with pytest.raises(InvalidOptionError, match="one argument after ctx"):
        app.scheduled(every=60)(no_argument)  # type: ignore[type-var]

    @app.workflow()
    async def job(ctx: Context, scheduled_at: str) -> None:
        return None

    app.scheduled(every=60, name="job")(job)
    app.scheduled(every=60, name="job")(job)  # the same again: fine
    with pytest.raises(InvalidOptionError, match="already registered"):
        app.scheduled(every=120, name="job")(job)
    assert list(app.schedules) == ["job"]


def test_an_interval_has_no_instant_past_the_calendars_end() -> None:
    schedule = Schedule("t", "t", every=3e8)  # about 9.5 years
    last = schedule.next_after(datetime(9990, 1, 1, tzinfo=UTC))
    assert last == datetime(9993, 8, 3, 13, 20, tzinfo=UTC)
    assert schedule.next_after(last) is None  # the next would overflow a datetime


async def test_a_start_that_raises_something_else_is_reported_and_the_next_instant_runs(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n", clock=clock, on_error=errors.append)

    @app.scheduled(every=60)
    @app.workflow(name="job")
    async def job(ctx: Context, scheduled_at: str) -> None:
        return None

    start = app.start
    failures = [RuntimeError("a decorator's bug")]

    async def flaky_start(*args: object, **kwargs: object) -> object:
        if failures:
            raise failures.pop()
        return await start(*args, **kwargs)  # type: ignore[call-overload]

    app.start = flaky_start  # type: ignore[method-assign,assignment]
    async with app:
        await clock.advance(120)
        assert [type(e).__name__ for e in errors] == ["RuntimeError"]
        assert [e for e, _, _ in await started(app)] == ["job@2030-01-01T00:02:00Z"]


async def test_a_schedule_stopped_by_a_bug_says_so(
    storage: Storage, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure outside the start of an instant (here the schedule's own next instant,
    broken) ends the schedule's task: on_error hears of it, and an ERROR line says the
    schedule is no longer served. Before, the task died unheard."""
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n", clock=clock, on_error=errors.append)

    @app.scheduled(every=60)
    @app.workflow(name="job")
    async def job(ctx: Context, scheduled_at: str) -> None:
        return None

    computed = Schedule.next_after
    calls: list[datetime] = []
    bug = ArithmeticError("a broken calendar")

    def breaking(self: Schedule, moment: datetime) -> datetime | None:
        calls.append(moment)
        if len(calls) > 1:
            raise bug
        return computed(self, moment)

    monkeypatch.setattr(Schedule, "next_after", breaking)
    caplog.set_level(logging.ERROR, logger="loom_runtime")
    async with app:
        await clock.advance(120)
        assert errors == [bug]
        assert [r.getMessage() for r in caplog.records] == [
            "schedule 'job' is no longer served in this process: ArithmeticError: a broken "
            "calendar; it is served again when the app is entered again"
        ]
        assert not await started(app)


async def test_a_start_that_raises_at_every_instant_is_reported_once_and_its_end_logged(
    storage: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    """An every-second schedule whose start meets the same bug (a decorator's) for an
    hour: on_error hears of the first, and of one of another type; the others go to
    DEBUG, and the instant that starts again is logged once at INFO."""
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n", clock=clock, on_error=errors.append)

    @app.scheduled(every=1)
    @app.workflow(name="job")
    async def job(ctx: Context, scheduled_at: str) -> None:
        return None

    start = app.start
    bug: list[Exception] = [RuntimeError("a decorator's bug")]

    async def buggy_start(*args: object, **kwargs: object) -> object:
        if bug:
            raise bug[0]
        return await start(*args, **kwargs)  # type: ignore[call-overload]

    app.start = buggy_start  # type: ignore[method-assign,assignment]
    caplog.set_level(logging.DEBUG, logger="loom_runtime")
    async with app:
        await clock.advance(3600)
        assert errors == [bug[0]]
        other = KeyError("another bug")
        bug[0] = other
        await clock.advance(10)
        assert [type(e) for e in errors] == [RuntimeError, KeyError]
        assert not [r for r in caplog.records if r.levelno == logging.INFO]
        bug.clear()
        await clock.advance(1)
        assert await started(app)
        back = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert back == ["schedule 'job' starts its instants again"]
    assert len(errors) == 2


async def test_a_drain_returns_while_a_schedule_keeps_coming_due(storage: Storage) -> None:
    """Runs of an every-second schedule that last longer than a second overlap: a drain
    holds the instants that come due while it waits, so it returns, and they are started
    after it. Real time (the runs sleep): only the drain's return is asserted, with a
    bound far past what it takes."""
    app = Loom(storage, node="n", poll_interval=0.05)
    starts: list[str] = []
    second, after_drain = asyncio.Event(), asyncio.Event()
    drained: int | None = None

    @app.scheduled(every=1)
    @app.workflow(name="slow")
    async def slow(ctx: Context, scheduled_at: str) -> None:
        starts.append(scheduled_at)
        if len(starts) == 2:
            second.set()
        if drained is not None and len(starts) > drained:
            after_drain.set()
        await ctx.step(asyncio.sleep, 1.5, name="work")

    async with app:
        await asyncio.wait_for(second.wait(), 30)
        await asyncio.wait_for(app.drain(), 30)
        drained = len(starts)
        await asyncio.wait_for(after_drain.wait(), 30)  # the instants held meanwhile


async def test_an_advance_that_a_drain_waits_for_starts_an_instant_due_meanwhile_after_it(
    storage: Storage,
) -> None:
    """A drain waits for a run waiting out a retry's interval on a virtual clock, and the
    test advances the clock from another task, as docs/runtime.md says to. An instant of
    a schedule that comes due before the retry is held until the drain returns, then
    started; the advance goes on meanwhile (it waited for the scheduler, which waited
    for the drain, which waited for the clock: it hung at the instant)."""
    clock = VirtualClock()
    app = Loom(storage, node="n", clock=clock)
    tries: list[datetime] = []

    def flaky() -> str:
        tries.append(clock.now())
        if len(tries) == 1:
            raise ConnectionError("the service is down")
        return "ok"

    @app.workflow(name="retrying")
    async def retrying(ctx: Context) -> str:
        return await ctx.step(
            flaky, retry=Retry(attempts=2, initial_interval=100, max_interval=100)
        )

    @app.scheduled(every=60)
    @app.workflow(name="tick")
    async def tick(ctx: Context, scheduled_at: str) -> str:
        return scheduled_at

    async with app:
        await app.start(retrying, id="r")
        await clock.advance(0)  # the first attempt failed: the next is due at +100 s
        drain = asyncio.create_task(app.drain())
        await asyncio.wait_for(clock.advance(150), 10)  # a bound, never reached
        await asyncio.wait_for(drain, 10)
        assert tries == [START, START + timedelta(seconds=100)]
        assert await started(app) == [
            ("r", [], "completed"),
            ("tick@2030-01-01T00:01:00Z", ["2030-01-01T00:01:00+00:00"], "completed"),
            ("tick@2030-01-01T00:02:00Z", ["2030-01-01T00:02:00+00:00"], "completed"),
        ]


class JumpingClock:
    """A clock that moves by itself (it has no ``tick``) and that the test jumps: each
    sleep is recorded and lasts until the test lets it go."""

    def __init__(self, now: datetime) -> None:
        self.moment = now
        self.asked: list[float] = []
        self.asleep = asyncio.Event()
        self.wake = asyncio.Event()

    def now(self) -> datetime:
        return self.moment

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        self.asked.append(seconds)
        self.asleep.set()
        await self.wake.wait()
        self.wake.clear()


async def test_a_jump_of_the_wall_clock_delays_an_instant_by_a_minute_at_most(
    storage: Storage,
) -> None:
    """A host suspended for hours, or a clock stepped forward, leaves a sleep on the
    monotonic clock with its whole length still to run: the scheduler sleeps a minute at
    a time and reads the clock after each, so the instant the jump passed starts then."""
    clock = JumpingClock(datetime(2030, 1, 1, 8, 0, tzinfo=UTC))
    app = Loom(storage, node="n", clock=clock, poll_interval=1234)  # the timer service's

    @app.scheduled(cron="0 9 * * *")
    @app.workflow(name="daily")
    async def daily(ctx: Context, scheduled_at: str) -> str:
        return scheduled_at

    async with app:

        async def scheduler_sleeps(count: int) -> list[float]:
            while (asked := [s for s in clock.asked if s != 1234]).count(60.0) < count:
                clock.asleep.clear()
                await asyncio.wait_for(clock.asleep.wait(), 5)
            return asked

        # An hour to go, slept a minute at a time.
        assert await scheduler_sleeps(1) == [60.0]
        clock.moment += timedelta(hours=6)  # the host slept; the instant passed
        clock.wake.set()
        # It starts the instant, then sleeps towards the next day's.
        assert await scheduler_sleeps(2) == [60.0, 60.0]
        handle = app.get("daily@2030-01-01T09:00:00Z")
        assert await handle.result(timeout=5) == "2030-01-01T09:00:00+00:00"


async def narrow_store(failures: list[LoomError]) -> Storage:
    """A memory store that leaves ids 340 of the kernel's 512 bytes, as a decorator that
    prefixes them would, refusing a longer one when it is read; the first reads of a long
    id raise ``failures`` instead, one each."""
    from store_probes import ProbedEventStore

    from loom_core import InvalidExecutionIdError

    limit = 340

    def refuse_long(execution_id: str) -> None:
        if len(execution_id.encode()) > limit:
            if failures:
                raise failures.pop(0)
            raise InvalidExecutionIdError(execution_id, f"at most {limit} bytes here")

    base = await open_storage("memory://")
    probe = ProbedEventStore(base.events)
    probe.after_read = refuse_long
    return Storage(probe, base.timers, base.leases, url=base.url, on_close=base.close)


async def test_a_name_too_long_for_the_store_is_reported_once_and_not_served() -> None:
    """The decorator checks a name against the kernel's limit; a decorator of the store may
    leave less (the tenant decorator's prefix). Such a schedule is reported to on_error
    when the app starts serving it, not at every instant, and starts nothing."""
    storage = await narrow_store([])
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n", clock=clock, on_error=errors.append)
    long_name, fitting = "l" * 300, "f" * 200

    @app.scheduled(every=60, name=long_name)
    @app.scheduled(every=60, name=fitting)
    @app.workflow(name="tick")
    async def tick(ctx: Context, scheduled_at: str) -> None:
        return None

    async with app:
        await clock.advance(180)
        ids = [e for e, _, _ in await started(app)]
    await storage.close()
    assert ids == [tick_id(fitting, START + timedelta(minutes=m)) for m in (1, 2, 3)]
    assert len(errors) == 1
    assert isinstance(errors[0], InvalidOptionError)
    assert long_name in str(errors[0])
    assert "shorter name=" in str(errors[0])


async def test_a_store_that_fails_the_name_check_is_asked_again() -> None:
    """The check of a long name asks the store; a store that fails then is asked again
    (its failure reported once) rather than taken as a yes."""
    from loom_core import StorageUnavailableError

    storage = await narrow_store([StorageUnavailableError("down for a moment")])
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n", clock=clock, on_error=errors.append)

    @app.scheduled(every=60, name="l" * 300)
    @app.workflow(name="tick")
    async def tick(ctx: Context, scheduled_at: str) -> None:
        return None

    async with app:
        await clock.advance(300)
        assert await started(app) == []
    await storage.close()
    assert [type(e) for e in errors] == [StorageUnavailableError, InvalidOptionError]


async def test_a_name_check_that_meets_a_bug_is_reported_and_asked_again() -> None:
    """The check of a long name meets an error that is no LoomError (a decorator's bug):
    it is reported to on_error and the check made again, and the schedule is served once
    it passes (the schedule stopped, with nothing reported)."""
    from store_probes import ProbedEventStore

    base = await open_storage("memory://")
    probe = ProbedEventStore(base.events)
    bugs = [RuntimeError("a decorator's bug")]

    def buggy(execution_id: str) -> None:
        if len(execution_id.encode()) > 256 and bugs:
            raise bugs.pop()

    probe.after_read = buggy
    storage = Storage(probe, base.timers, base.leases, url=base.url, on_close=base.close)
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom(storage, node="n", clock=clock, on_error=errors.append)
    name = "f" * 260  # its ids are probed: over 256 bytes

    @app.scheduled(every=60, name=name)
    @app.workflow(name="tick")
    async def tick(ctx: Context, scheduled_at: str) -> None:
        return None

    async with app:
        await clock.advance(120)
        assert [e for e, _, _ in await started(app)] == [
            f"{name}@2030-01-01T00:01:00Z",
            f"{name}@2030-01-01T00:02:00Z",
        ]
    await storage.close()
    assert [(type(e), str(e)) for e in errors] == [(RuntimeError, "a decorator's bug")]


async def test_a_run_slower_than_the_interval_overlaps_the_next_instants(
    app: Loom, clock: VirtualClock
) -> None:
    @app.scheduled(every=60, name="slow")
    @app.workflow()
    async def slow(ctx: Context, scheduled_at: str) -> str:
        await ctx.sleep(150)  # longer than two intervals
        return scheduled_at

    await clock.advance(180)
    assert await started(app) == [
        ("slow@2030-01-01T00:01:00Z", ["2030-01-01T00:01:00+00:00"], "suspended"),
        ("slow@2030-01-01T00:02:00Z", ["2030-01-01T00:02:00+00:00"], "suspended"),
        ("slow@2030-01-01T00:03:00Z", ["2030-01-01T00:03:00+00:00"], "suspended"),
    ]
    await clock.advance(150)
    assert [s for _, _, s in await started(app)][:3] == ["completed"] * 3
    assert await check_replay(app) == [e for e, _, _ in await started(app)]


async def test_two_apps_on_one_sqlite_file_start_each_instant_once(tmp_path: Path) -> None:
    clock = VirtualClock()
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    runs: list[tuple[str, str]] = []

    def app(node: str) -> Loom:
        loom = Loom(url, node=node, clock=clock)

        async def note(at: str) -> None:
            runs.append((node, at))

        @loom.scheduled(cron="*/10 * * * *", name="sweep")
        @loom.workflow(name="sweep")
        async def sweep(ctx: Context, scheduled_at: str) -> None:
            await ctx.step(note, scheduled_at)

        return loom

    async with app("a") as a, app("b"):
        await clock.advance(timedelta(hours=1))
        ids = [e for e, _, _ in await started(a)]
        assert ids == [f"sweep@2030-01-01T00:{m}0:00Z" for m in range(1, 6)] + [
            "sweep@2030-01-01T01:00:00Z"
        ]
        for execution_id in ids:
            kinds = [e.kind for e in await a.storage.events.read(execution_id)]
            assert kinds.count(EventKind.EXECUTION_STARTED) == 1
            assert kinds.count(EventKind.STEP_COMPLETED) == 1
    assert sorted(at for _, at in runs) == sorted(
        (START + timedelta(minutes=m)).isoformat() for m in range(10, 61, 10)
    )


async def test_a_renamed_schedule_runs_an_instant_under_each_name_while_both_serve(
    storage: Storage,
) -> None:
    clock = VirtualClock()

    async def report(ctx: Context, scheduled_at: str) -> None:
        return None

    old = Loom(storage, node="old", clock=clock)
    old.scheduled(every=3600, name="report")(old.workflow(name="report")(report))
    new = Loom(storage, node="new", clock=clock)
    new.scheduled(every=3600, name="daily-report")(new.workflow(name="report")(report))
    async with old, new:  # a rolling deploy: nodes on both codes serve
        await clock.advance(3600)
        assert [e for e, _, _ in await started(old)] == [
            "daily-report@2030-01-01T01:00:00Z",
            "report@2030-01-01T01:00:00Z",
        ]


async def test_a_renamed_workflow_keeping_its_schedules_name_runs_each_instant_once(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    errors: list[BaseException] = []

    async def report(ctx: Context, scheduled_at: str) -> None:
        return None

    old = Loom(storage, node="old", clock=clock)
    old.scheduled(every=3600, name="report")(old.workflow(name="report")(report))
    new = Loom(storage, node="new", clock=clock, on_error=errors.append)
    new.scheduled(every=3600, name="report")(new.workflow(name="report-v2")(report))
    async with old:
        await clock.advance(3600)  # the old code started this instant
        async with new:
            await clock.advance(3600)
            assert [(e, s) for e, _, s in await started(old)] == [
                ("report@2030-01-01T01:00:00Z", "completed"),
                ("report@2030-01-01T02:00:00Z", "completed"),
            ]
    # Whichever node came second met the other code's workflow at the id.
    assert [type(e).__name__ for e in errors] in ([], ["ExecutionAlreadyExistsError"])


async def test_a_schedule_removed_between_deploys_starts_nothing_and_its_runs_stay(
    tmp_path: Path,
) -> None:
    clock = VirtualClock()
    url = f"sqlite:///{tmp_path / 'loom.db'}"

    async def tick(ctx: Context, scheduled_at: str) -> str:
        return scheduled_at

    first = Loom(url, node="n", clock=clock)
    first.scheduled(every=60)(first.workflow(name="tick")(tick))
    async with first:
        await clock.advance(120)
    again = Loom(url, node="n", clock=clock)  # the next deploy: no @app.scheduled
    again.workflow(name="tick")(tick)
    async with again:
        await clock.advance(600)
        assert await started(again) == [
            ("tick@2030-01-01T00:01:00Z", ["2030-01-01T00:01:00+00:00"], "completed"),
            ("tick@2030-01-01T00:02:00Z", ["2030-01-01T00:02:00+00:00"], "completed"),
        ]
        assert again.schedules == {}
        assert len(await check_replay(again)) == 2


NODE = textwrap.dedent(
    """
    import asyncio, sys
    from loom_runtime import Context, Loom

    node = sys.argv[2]
    app = Loom(sys.argv[1], node=node, poll_interval=0.05)

    def ran_on() -> str:
        return node

    @app.scheduled(every=1, name="tick")
    @app.workflow(name="tick")
    async def tick(ctx: Context, scheduled_at: str) -> str:
        return await ctx.step(ran_on)

    async def main() -> None:
        async with app:
            print("up", flush=True)
            while True:  # until three instants have run, whichever node ran them
                done = [v async for v in app.executions(status="completed")]
                if len(done) >= 3:
                    break
                await asyncio.sleep(0.1)
            await app.drain()
        print("done", flush=True)

    asyncio.run(main())
    """
)


async def test_two_processes_on_one_sqlite_file_start_each_instant_once(
    tmp_path: Path,
) -> None:
    """Real processes on the wall clock, each serving the schedule: every instant either
    of them reached is one execution, started once, its step run once."""
    script = tmp_path / "node.py"
    script.write_text(NODE)
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    nodes = [
        await ChildProcess.spawn(
            sys.executable, str(script), url, name, stderr=tmp_path / f"{name}.err"
        )
        for name in ("a", "b")
    ]
    try:
        for node in nodes:
            assert await node.line() == "up", node.stderr_tail()
        for node in nodes:
            assert await node.finish() == 0, node.stderr_tail()
            assert node.lines == ["up", "done"]
    finally:
        for node in nodes:
            node.kill()
    async with open_storage(url) as storage:
        completed = 0
        for execution_id in await storage.events.list_executions(limit=1000):
            assert execution_id.startswith("tick@")
            kinds = [e.kind for e in await storage.events.read(execution_id)]
            assert kinds.count(EventKind.EXECUTION_STARTED) == 1, execution_id
            assert kinds.count(EventKind.STEP_COMPLETED) <= 1, execution_id
            completed += EventKind.EXECUTION_COMPLETED in kinds
        assert completed >= 3


async def test_a_schedule_registered_again_keeps_the_instant_it_is_starting(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow(name="job")
    async def job(ctx: Context, scheduled_at: str) -> None:
        return None

    app.scheduled(every=60)(job)
    start = app.start
    entered = asyncio.Event()
    release = asyncio.Event()

    async def held_start(*args: object, **kwargs: object) -> object:
        entered.set()
        await release.wait()  # the instant's start is in flight while the schedule is added
        return await start(*args, **kwargs)  # type: ignore[call-overload]

    app.start = held_start  # type: ignore[method-assign,assignment]
    advancing = asyncio.create_task(clock.advance(60))
    await entered.wait()
    app.scheduled(every=60)(job)  # the same schedule again (a module imported twice)
    with pytest.raises(InvalidOptionError, match="already registered"):
        app.scheduled(every=30)(job)  # another under its name: refused, and nothing changes
    release.set()
    await advancing
    await clock.advance(60)
    assert [e for e, _, _ in await started(app)] == [
        "job@2030-01-01T00:01:00Z",
        "job@2030-01-01T00:02:00Z",
    ]
    assert app.schedules["job"].every == 60


async def test_an_outage_under_a_frequent_schedule_logs_a_few_lines_not_two_an_instant(
    storage: Storage, caplog: pytest.LogCaptureFixture
) -> None:
    """Every start of a schedule due each second fails for 100 s, and each instant is
    given up at the next: the outage is one ERROR (the failure, to on_error's default),
    one WARNING (the first instant given up) and one INFO once an instant starts again,
    naming how many were given up; not two lines a second for as long as it lasts."""
    from loom_core import StorageUnavailableError

    clock = VirtualClock()
    app = Loom(storage, node="n", clock=clock)

    @app.scheduled(every=1)
    @app.workflow(name="pulse")
    async def pulse(ctx: Context, scheduled_at: str) -> None:
        return None

    start = app.start
    down = True

    async def failing_start(*args: object, **kwargs: object) -> object:
        if down:
            raise StorageUnavailableError("the store is down (a test's outage)")
        return await start(*args, **kwargs)  # type: ignore[call-overload]

    app.start = failing_start  # type: ignore[method-assign,assignment]
    caplog.set_level(logging.DEBUG, logger="loom_runtime")
    async with app:
        for _ in range(100):
            await clock.advance(1)
        down = False
        await clock.advance(2)
        assert len(await started(app)) >= 1  # it starts instants again
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in lines] == ["ERROR", "WARNING", "INFO"], lines
    assert "gave up its instant" in lines[1][1]
    assert "'pulse'" in lines[2][1]
    assert "gave up 100 " in lines[2][1]  # one a second, counted
