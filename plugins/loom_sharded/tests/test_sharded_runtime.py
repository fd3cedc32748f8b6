"""Workflows (``loom-runtime``) over three SQLite shards without ``colocate``: an execution
whose inbox (``$inbox:<id>``) and successor (``<id>#1``) each live on another shard than
its own still gets its messages, continues as new, forks and is recovered."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from loom_runtime import Context, Loom
from loom_sharded import ShardedEventStore


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
