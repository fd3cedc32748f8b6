"""Workflows (``loom-runtime``) over three SQLite shards without ``colocate``: an execution
whose inbox (``$inbox:<id>``) and successor (``<id>#1``) each live on another shard than
its own still gets its messages, continues as new, forks and is recovered; and two
tenants (``tenant`` above ``sharded``) run the same execution id apart."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from loom_runtime import Context, Loom
from loom_runtime.testing import VirtualClock
from loom_sharded import ShardedEventStore

from loom_core import open_storage


async def relay(ctx: Context, generation: int) -> list[object]:
    """Takes one message per generation; the first generation continues as new."""
    value = await ctx.receive("go")
    if generation == 0:
        ctx.continue_as_new(1)
    return [generation, value]


@asynccontextmanager
async def app_over_shards(tmp_path: Path) -> AsyncIterator[Loom]:
    shards = [f"sqlite:///{tmp_path / f'shard-{i}.db'}" for i in range(3)]
    app = Loom(
        shards[0], decorators=[("sharded", {"shards": shards[1:]})], node="n1",
        random=random.Random(7), timers=False, recover=False,
    )
    app.workflow(name="relay")(relay)
    async with app:
        yield app


def spread_id(events: ShardedEventStore) -> str:
    """The first id whose log, inbox and successor are on three different shards."""
    for n in range(1000):
        candidate = f"order-{n}"
        placed = {events.shard_of(x) for x in (candidate, f"$inbox:{candidate}", f"{candidate}#1")}
        if len(placed) == 3:
            return candidate
    raise AssertionError("no id spreads over the three shards")


async def test_messages_continue_as_new_and_forks_work_across_shards(tmp_path: Path) -> None:
    async with app_over_shards(tmp_path) as app:
        assert isinstance(app.storage.events, ShardedEventStore)
        order = spread_id(app.storage.events)
        handle = await app.start("relay", 0, id=order)
        await app.drain()
        await app.send(order, "go", "first")
        await app.drain()
        assert (await app.inspect(order)).successor == f"{order}#1"
        await app.send(order, "go", "second")  # handed on to the successor
        assert await handle.result(timeout=10) == [1, "second"]

        fork = await app.fork(order, at=0, id=f"{order}-again")
        await app.drain()
        await fork.send("go", "third")
        await app.drain()
        await fork.send("go", "fourth")
        assert await fork.result(timeout=10) == [1, "fourth"]


async def test_an_execution_left_running_is_recovered_across_shards(tmp_path: Path) -> None:
    held = asyncio.Event()

    async def hold(ctx: Context) -> object:
        await ctx.step(held.wait)
        return await ctx.receive("go")

    async with app_over_shards(tmp_path) as app:
        app.workflow(name="hold")(hold)
        assert isinstance(app.storage.events, ShardedEventStore)
        order = spread_id(app.storage.events)
        await app.start("hold", id=order)
    async with app_over_shards(tmp_path) as app:
        app.workflow(name="hold")(hold)
        held.set()
        (taken,) = await app.recover()
        assert taken.execution_id == order
        await app.send(order, "go", "late")
        assert await taken.result(timeout=10) == "late"


async def waits(ctx: Context, who: str) -> str:
    """Parks on a message, then on a 60 s sleep, then says whose it was."""
    value = await ctx.receive("go")
    await ctx.sleep(60)
    return f"{who}:{value}"


@pytest.mark.parametrize("colocate", [None, "/"])
async def test_two_tenants_over_one_set_of_shards_run_the_same_id_apart(
    tmp_path: Path, colocate: str | None
) -> None:
    """``tenant`` above ``sharded``, two apps over the same three files, one tenant named
    like the other's stored prefix: the same execution id is two executions whose
    messages, timers, listings, forks and cancels never cross."""
    clock = VirtualClock()
    shards = [f"sqlite:///{tmp_path / f'shard-{i}.db'}" for i in range(3)]
    options: dict[str, object] = {"shards": shards[1:]}
    if colocate is not None:
        options["colocate"] = colocate

    def app(tenant: str) -> Loom:
        loom = Loom(
            shards[0], decorators=[("sharded", options), ("tenant", {"tenant": tenant})],
            node="n1", clock=clock, random=random.Random(7), timers=False, recover=False,
        )
        loom.workflow(name="waits")(waits)
        return loom

    async with AsyncExitStack() as stack:
        acme = await stack.enter_async_context(app("acme"))
        other = await stack.enter_async_context(app("4:acme/"))
        a = await acme.start("waits", "A", id="order-1")
        z = await other.start("waits", "Z", id="order-1")
        await acme.drain()
        await other.drain()

        await acme.send("order-1", "go", "for-acme")
        await acme.drain()
        assert (await acme.inspect("order-1")).consumed
        assert not (await other.inspect("order-1")).consumed
        assert [v.execution_id async for v in acme.executions()] == ["order-1"]
        assert [v.execution_id async for v in other.executions()] == ["order-1"]

        await clock.advance(60)
        assert await other.timer_service.poll_once() == {}
        assert list((await acme.timer_service.poll_once()).values()) == ["resumed"]
        await acme.drain()
        assert await a.result(timeout=5) == "A:for-acme"
        assert await z.status() == "suspended"

        fork = await acme.fork("order-1", id="order-1-again")
        assert await fork.result(timeout=5) == "A:for-acme"
        assert (await other.inspect("order-1-again")).status is None

        assert await other.cancel("order-1") is True
        assert await z.status() == "cancelled"
        assert await a.status() == "completed"
    async with await open_storage(
        shards[0], decorators=[("sharded", options)]
    ) as bare:  # what the shards hold: each tenant's ids under its own prefix
        listed = await bare.events.list_executions(limit=100)
        assert "4:acme/order-1" in listed
        assert "7:4:acme//order-1" in listed
        assert all(i.startswith(("4:acme/", "7:4:acme//")) for i in listed)
