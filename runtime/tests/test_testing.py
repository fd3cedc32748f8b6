"""The test kit's replay check on cancelled executions: a cancellation cuts the body
wherever it was, and the replay must match the log up to that cut, no further."""

from __future__ import annotations

import asyncio
import random

import pytest
from loom_runtime import Context, Loom, ReplayDivergedError
from loom_runtime.testing import check_replay

from loom_core import EventKind


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
