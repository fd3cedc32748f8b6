"""Two tenants' apps over one SQLite file (``decorators=[("tenant", ...)]``), with the same
execution ids: starts, messages, timers, listings, cancels, forks and recovery of one
tenant never see, wake, recover or cancel the other's executions."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from loom_runtime import Context, Loom
from loom_runtime.testing import VirtualClock


async def waits(ctx: Context, who: str) -> str:
    """Parks on a message, then on a 60 s sleep, then says whose it was."""
    value = await ctx.receive("go")
    await ctx.sleep(60)
    return f"{who}:{value}"


@asynccontextmanager
async def tenants(tmp_path: Path) -> AsyncIterator[tuple[Loom, Loom, VirtualClock]]:
    """Apps of ``acme`` and ``zeta`` on one file and one virtual clock; no background
    timer service, no recovery on entry: the tests poll and recover by hand."""
    clock = VirtualClock()
    url = f"sqlite:///{tmp_path / 'shared.db'}"

    def app(tenant: str) -> Loom:
        loom = Loom(
            url, decorators=[("tenant", {"tenant": tenant})], node="n1", clock=clock,
            random=random.Random(7), timers=False, recover=False,
        )
        loom.workflow(name="waits")(waits)
        return loom

    async with AsyncExitStack() as stack:
        acme = await stack.enter_async_context(app("acme"))
        zeta = await stack.enter_async_context(app("zeta"))
        yield acme, zeta, clock


async def test_the_same_id_in_two_tenants_is_two_executions_that_never_meet(
    tmp_path: Path,
) -> None:
    async with tenants(tmp_path) as (acme, zeta, clock):
        a = await acme.start("waits", "A", id="order-1")
        z = await zeta.start("waits", "Z", id="order-1")
        await acme.drain()
        await zeta.drain()

        await acme.send("order-1", "go", "for-acme")
        await acme.drain()
        assert (await acme.inspect("order-1")).consumed
        assert not (await zeta.inspect("order-1")).consumed
        assert [(v.execution_id, v.input) async for v in acme.executions()] == [
            ("order-1", ["A"])
        ]
        assert [(v.execution_id, v.input) async for v in zeta.executions()] == [
            ("order-1", ["Z"])
        ]

        await clock.advance(60)
        assert await zeta.timer_service.poll_once() == {}  # acme's row is not zeta's
        assert list((await acme.timer_service.poll_once()).values()) == ["resumed"]
        await acme.drain()
        assert await a.result(timeout=5) == "A:for-acme"
        assert await z.status() == "suspended"

        fork = await acme.fork("order-1", id="order-1-again")
        assert await fork.result(timeout=5) == "A:for-acme"
        assert (await zeta.inspect("order-1-again")).status is None

        assert await zeta.cancel("order-1") is True
        assert await z.status() == "cancelled"
        assert await a.status() == "completed"


async def test_a_tenants_recovery_takes_over_only_its_own_executions(tmp_path: Path) -> None:
    held = asyncio.Event()

    async def hold(ctx: Context) -> str:
        await ctx.step(held.wait)
        return "done"

    async with tenants(tmp_path) as (acme, zeta, _):
        acme.workflow(name="hold")(hold)
        zeta.workflow(name="hold")(hold)
        await acme.start("hold", id="job")
        await zeta.start("waits", "Z", id="job")
        await zeta.drain()
    # acme's app left its run in the step: its execution is running, of node n1
    async with tenants(tmp_path) as (acme, zeta, _):
        acme.workflow(name="hold")(hold)
        zeta.workflow(name="hold")(hold)
        assert await zeta.recover() == []
        assert (await zeta.inspect("job")).status == "suspended"
        assert (await acme.inspect("job")).recoveries == 0
        held.set()
        (taken,) = await acme.recover()
        assert taken.execution_id == "job"
        assert await taken.result(timeout=5) == "done"
        assert (await zeta.inspect("job")).status == "suspended"
