"""The test kit's replay check on cancelled executions: a cancellation cuts the body
wherever it was, and the replay must match the log up to that cut, no further."""

from __future__ import annotations

import asyncio
import random

import pytest
from loom_runtime import Context, Loom, ReplayDivergedError, ResultTimeoutError, Retry
from loom_runtime.testing import VirtualClock, check_replay, crash_at

from loom_core import EventKind, open_storage


async def test_an_execution_cancelled_while_parked_replays_cleanly(app: Loom) -> None:
    @app.workflow()
    async def nap(ctx: Context) -> str:
        await ctx.sleep(30)
        return "awake"

    await app.start(nap, id="nap")
    await app.drain()
    assert await app.cancel("nap", reason="no longer needed")
    before = await app.storage.events.read("nap")
    assert await check_replay(app) == ["nap"]
    assert await app.storage.events.read("nap") == before


async def test_an_execution_cancelled_while_running_replays_cleanly(app: Loom) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def charge() -> str:
        started.set()
        await release.wait()
        return "charged"

    @app.workflow()
    async def pay(ctx: Context) -> str:
        return await ctx.step(charge)

    await app.start(pay, id="pay")
    await started.wait()
    assert await app.cancel("pay")
    release.set()
    await app.drain()
    kinds = [e.kind for e in await app.storage.events.read("pay")]
    assert kinds == [EventKind.EXECUTION_STARTED, EventKind.EXECUTION_CANCELLED]
    assert await check_replay(app) == ["pay"]


async def test_a_changed_body_before_the_cancellation_still_diverges(app: Loom) -> None:
    async def reserve() -> str:
        return "reserved"

    @app.workflow(name="order")
    async def order(ctx: Context) -> None:
        await ctx.step(reserve, name="reserve")
        await ctx.sleep(30)

    await app.start(order, id="order")
    await app.drain()
    assert await app.cancel("order")

    deployed = Loom(app.storage, node="test-node", random=random.Random(7))

    @deployed.workflow(name="order")
    async def changed(ctx: Context) -> None:
        await ctx.step(reserve, name="reserve-stock")
        await ctx.sleep(30)

    with pytest.raises(ReplayDivergedError) as diverged:
        await check_replay(deployed)
    assert diverged.value.position == "0"


async def test_a_crashed_run_waits_for_recover_even_while_the_recovery_on_entering_lists() -> None:
    """``crash_at`` stops a run as a killed process would, and the execution stays running
    until ``app.recover()``. The recovery that entering the app starts is for what a
    previous process left: one still listing the store when the crash comes (a store with
    many executions, a slow disk) must not take over a run this process started."""
    async with await open_storage("memory://") as storage:
        listing = asyncio.Event()
        list_executions = storage.events.list_executions

        async def slow_listing(**options: object) -> tuple[str, ...]:
            await listing.wait()
            return await list_executions(**options)  # type: ignore[arg-type]

        storage.events.list_executions = slow_listing  # type: ignore[method-assign]
        app = Loom(storage, node="n1", clock=VirtualClock(), timers=False)
        ran: list[str] = []

        async def charge() -> str:
            ran.append("charge")
            return "charged"

        @app.workflow()
        async def order(ctx: Context) -> str:
            return await ctx.step(charge)

        async with app:
            crash = crash_at(app, step="charge", when="before")
            await app.start(order, id="o")
            await crash.fired.wait()
            listing.set()
            await app.drain()  # the recovery on entering has finished
            assert await app.get("o").status() == "running"
            assert ran == []
            assert [h.execution_id for h in await app.recover()] == ["o"]
            assert await app.get("o").result(timeout=5) == "charged"
            assert ran == ["charge"]


async def test_a_crash_between_a_step_and_its_record_runs_the_step_again_on_recovery(
    app: Loom,
) -> None:
    """``when="unrecorded"``: the step ran (its side effect happened) and the process died
    before its result was written, the case that makes a step at least once. Recovery
    runs it again; a step after it runs once."""
    charged: list[str] = []
    mailed: list[str] = []

    async def charge(order: str) -> str:
        charged.append(order)
        return f"charged {order}"

    async def mail(order: str) -> None:
        mailed.append(order)

    @app.workflow()
    async def checkout(ctx: Context, order: str) -> str:
        receipt = await ctx.step(charge, order)
        await ctx.step(mail, order)
        return receipt

    crash = crash_at(app, step="charge", when="unrecorded")
    handle = await app.start(checkout, "o-1", id="o-1")
    await asyncio.wait_for(crash.fired.wait(), 10)
    assert charged == ["o-1"]
    kinds = [e.kind for e in await app.storage.events.read("o-1")]
    assert kinds == [EventKind.EXECUTION_STARTED]  # the charge ran; nothing of it is written
    await app.recover()
    assert await handle.result(timeout=10) == "charged o-1"
    assert charged == ["o-1", "o-1"]
    assert mailed == ["o-1"]
    assert await check_replay(app) == ["o-1"]


async def test_a_crash_between_a_failed_attempt_and_its_record_makes_the_attempt_again(
    app: Loom,
) -> None:
    tries: list[int] = []

    async def flaky() -> str:
        tries.append(len(tries) + 1)
        if len(tries) < 3:
            raise ConnectionError("down")
        return "up"

    @app.workflow()
    async def retried(ctx: Context) -> str:
        return await ctx.step(flaky, retry=Retry(attempts=3, initial_interval=0))

    crash = crash_at(app, step="flaky", when="unrecorded")
    handle = await app.start(retried, id="r")
    await asyncio.wait_for(crash.fired.wait(), 10)
    assert [e.kind for e in await app.storage.events.read("r")] == [
        EventKind.EXECUTION_STARTED
    ]
    await app.recover()
    assert await handle.result(timeout=10) == "up"
    assert tries == [1, 2, 3]
    view = await app.inspect("r")
    assert view.records[(0,)].attempt == 2  # the first attempt, made twice, counts once


async def test_a_result_that_times_out_on_a_virtual_clock_says_the_clock_must_be_advanced(
    app: Loom,
) -> None:
    @app.workflow()
    async def nap(ctx: Context) -> str:
        await ctx.sleep(3600)
        return "awake"

    handle = await app.start(nap, id="nap")
    with pytest.raises(ResultTimeoutError, match=r"clock\.advance") as waited:
        await handle.result(timeout=0.01)
    assert waited.value.status == "suspended"

    @app.workflow()
    async def inbox(ctx: Context) -> object:
        return await ctx.receive("go")  # waits for a message: no advance would help

    waiting = await app.start(inbox, id="inbox")
    with pytest.raises(ResultTimeoutError) as waited:
        await waiting.result(timeout=0.01)
    assert "advance" not in str(waited.value)


async def test_a_result_that_times_out_after_a_crash_point_says_to_recover(app: Loom) -> None:
    async def charge() -> str:
        return "charged"

    @app.workflow()
    async def pay(ctx: Context) -> str:
        return await ctx.step(charge)

    crash = crash_at(app, step="charge", when="after")
    handle = await app.start(pay, id="pay")
    await asyncio.wait_for(crash.fired.wait(), 10)
    with pytest.raises(ResultTimeoutError, match=r"app\.recover\(\)") as waited:
        await handle.result(timeout=0.01)
    assert waited.value.status == "running"
    await app.recover()
    assert await handle.result(timeout=10) == "charged"
