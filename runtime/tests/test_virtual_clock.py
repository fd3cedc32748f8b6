"""The test kit's virtual clock: an advance stops at each instant something waits for,
fires what is due there, and returns once the apps on the clock have done the runtime's
part of it, on every store; however long the advance, it polls only at those instants."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from loom_runtime import Context, Loom, Retry, StepFailedError, TimerService
from loom_runtime.testing import VirtualClock
from loom_runtime.timers import Fired

from loom_core import TimerRecord, open_storage

START = datetime.fromisoformat("2030-01-01T00:00:00+00:00")


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/clock.db"


@pytest.fixture
async def app(url: str) -> AsyncIterator[Loom]:
    loom = Loom(url, node="n", clock=VirtualClock(START), random=random.Random(5))
    async with loom:
        yield loom


def clock_of(app: Loom) -> VirtualClock:
    assert isinstance(app.clock, VirtualClock)
    return app.clock


def seconds(at: object) -> float:
    assert isinstance(at, str)
    return (datetime.fromisoformat(at) - START).total_seconds()


async def nap(ctx: Context) -> str:
    await ctx.sleep(100)
    return "awake"


async def test_a_timer_due_within_an_advance_has_fired_when_it_returns(url: str) -> None:
    # A fresh app each time, and two advances in a row, the second landing on the
    # deadline: on SQLite the timer service used to be amid its first poll when the clock
    # jumped, and missed the instant.
    for i in range(20):
        clock = VirtualClock(START)
        app = Loom(url, node="n", clock=clock, random=random.Random(i))
        app.workflow(name="nap")(nap)
        async with app:
            handle = await app.start(nap, id=f"nap-{i}")
            await app.drain()
            await clock.advance(1)
            await clock.advance(99)
            assert await handle.status() == "completed", i


async def test_what_a_woken_body_does_inside_an_advance_happens_at_its_instant(
    app: Loom,
) -> None:
    attempts: list[float] = []

    def flaky() -> str:
        attempts.append((app.clock.now() - START).total_seconds())
        if len(attempts) < 3:
            raise ConnectionError("down")
        return "up"

    @app.workflow(name="timeline")
    async def timeline(ctx: Context) -> list[object]:
        seen: list[object] = []
        await ctx.sleep(10)
        seen.append(seconds(ctx.now().isoformat()))
        await ctx.sleep(15)  # set by the body the first timer woke, inside the advance
        seen.append(seconds(ctx.now().isoformat()))
        seen.append(await ctx.step(flaky, retry=Retry(attempts=3, initial_interval=5)))
        seen.append(seconds(ctx.now().isoformat()))
        return seen

    handle = await app.start(timeline, id="t")
    await app.drain()
    await clock_of(app).advance(1000)
    assert await handle.status() == "completed"
    assert await handle.result() == [10.0, 25.0, "up", 40.0]
    assert attempts == [25.0, 30.0, 40.0]  # retries wait 5 s, then 10 s, on this clock
    assert clock_of(app).now() == START + timedelta(seconds=1000)


async def test_a_long_advance_polls_only_at_the_instants_in_it(
    app: Loom, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls: list[datetime] = []
    poll_once = app.timer_service.poll_once

    async def counted() -> dict[TimerRecord, Fired]:
        polls.append(app.clock.now())
        return await poll_once()

    monkeypatch.setattr(app.timer_service, "poll_once", counted)

    @app.workflow(name="weekly")
    async def weekly(ctx: Context) -> int:
        for _ in range(4):
            await ctx.sleep(timedelta(days=7))
        return 4

    handle = await app.start(weekly, id="w")
    await app.drain()
    await clock_of(app).advance(timedelta(days=30))
    assert await handle.result() == 4
    # Polls at each of the four wake-ups (a second one there, since the first resumed a
    # body that might have set a timer due at once), and one at the end; with a poll
    # every poll_interval of virtual time this month would have been ten million of them.
    instants = [*(timedelta(days=7 * k) for k in range(1, 5)), timedelta(days=30)]
    assert sorted({p - START for p in polls}) == instants
    assert len(polls) == 2 * 4 + 1


async def test_an_advance_waits_for_a_step_still_running(app: Loom) -> None:
    in_step, release = asyncio.Event(), asyncio.Event()

    async def hold() -> str:
        in_step.set()
        await release.wait()
        return "held"

    @app.workflow(name="holds")
    async def holds(ctx: Context) -> object:
        value = await ctx.step(hold)
        await ctx.sleep(5)  # set once the step returns, due inside the same advance
        return value

    handle = await app.start(holds, id="h")
    advancing = asyncio.create_task(clock_of(app).advance(60))
    await in_step.wait()
    assert app.busy()  # the run, in its step: the advance cannot end before it does
    assert not advancing.done()
    release.set()
    await advancing
    assert await handle.status() == "completed"
    assert await handle.result() == "held"


async def test_a_retry_waits_on_the_apps_clock(app: Loom) -> None:
    @app.workflow(name="gives-up")
    async def gives_up(ctx: Context) -> str:
        def down() -> None:
            raise ConnectionError("down")

        try:
            await ctx.step(down, retry=Retry(attempts=2, initial_interval=30))
        except StepFailedError as exc:
            return f"{exc.attempts} attempts"
        return "up"

    handle = await app.start(gives_up, id="g")
    await clock_of(app).advance(0)  # returns once the run waits on the clock
    assert await handle.status() == "running"  # the retry waits 30 s of this clock
    await clock_of(app).advance(30)
    assert await handle.result() == "2 attempts"


async def test_a_backlog_due_at_one_instant_has_all_fired_when_the_advance_returns(
    url: str,
) -> None:
    """250 sleeps due at one instant, a service that fires one row a poll: the advance
    polls until every one is resumed, rather than stopping after a hundred polls at each
    instant it stops at (two here: the rows' instant and the advance's end) with fifty
    parked still."""
    loom = Loom(url, node="n", clock=VirtualClock(START), random=random.Random(5))
    loom.timer_service = TimerService(loom, batch=1)
    loom.workflow(name="nap")(nap)
    async with loom:
        ids = [f"e{i:03}" for i in range(250)]
        for execution_id in ids:
            await loom.start("nap", id=execution_id)
        await clock_of(loom).advance(101)
        statuses = [(await loom.inspect(execution_id)).status for execution_id in ids]
        assert statuses.count("completed") == 250


async def wake_time(ctx: Context, seconds: int) -> str:
    await ctx.sleep(seconds)
    return ctx.now().isoformat()


async def test_an_app_entering_on_a_fresh_clock_stops_at_every_row_already_written(
    url: str,
) -> None:
    """1001 sleeps parked by an app that has left (on a clock of its own), due a second
    apart: an app entering on a fresh clock over the same storage tells the clock of
    every row, so each body wakes at its own instant, the last too (the clock was told
    of the first 1000 rows only, and the last body read the advance's end)."""
    storage = await open_storage(url)
    try:
        before = Loom(storage, node="n", clock=VirtualClock(START), timers=False,
                      recover=False)
        before.workflow(name="wake_time")(wake_time)
        async with before:
            for i in range(1, 1002):
                await before.start("wake_time", i, id=f"w{i:04}")
            await before.drain()
        clock = VirtualClock(START)
        app = Loom(storage, node="n", clock=clock, random=random.Random(5))
        app.workflow(name="wake_time")(wake_time)
        async with app:
            await clock.advance(2000)
            for i in (1, 1000, 1001):
                woke = await app.get(f"w{i:04}").result()
                assert woke == (START + timedelta(seconds=i)).isoformat()
    finally:
        await storage.close()


async def test_advances_from_two_tasks_move_the_clock_by_both_in_turn(app: Loom) -> None:
    """A test advancing while an advance of its own task is held by a step: the second
    waits for the first and moves on from where it ended, so a woken body reads its own
    instant and the clock never goes back (it read the shorter advance's end, +10 s,
    after both had returned, and the body woken at +5 s read +10 s)."""
    in_step, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        in_step.set()
        await release.wait()

    @app.workflow(name="held-nap")
    async def held_nap(ctx: Context) -> float:
        await ctx.step(hold)
        await ctx.sleep(5)
        return seconds(ctx.now().isoformat())

    handle = await app.start(held_nap, id="h")
    clock = clock_of(app)
    first = asyncio.create_task(clock.advance(60))  # held by the step, as the docs allow
    await in_step.wait()
    second = asyncio.create_task(clock.advance(10))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, second)
    assert await handle.result() == 5.0
    assert clock.now() == START + timedelta(seconds=70)
