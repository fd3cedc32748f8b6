"""The timer service's loop with rows due by the thousand: a poll that retired a whole
batch is followed by the next at once, so a backlog drains at the store's pace rather than
a batch a ``poll_interval``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from loom_runtime import Context, Loom

from loom_core import Storage, open_storage

BATCH = 100  # the service's default


class GatedClock:
    """A wall-like clock whose time the test sets, and whose sleeps wait for the test:
    the timer service's first sleep shows what its polls did before it."""

    def __init__(self) -> None:
        self.at = datetime(2030, 1, 1, tzinfo=UTC)
        self.sleeps = 0
        self.slept = asyncio.Event()
        self.gate = asyncio.Event()

    def now(self) -> datetime:
        return self.at

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.slept.set()
        await self.gate.wait()


def napper(
    storage: Storage, clock: GatedClock, *, timers: bool = True, recover: bool = True
) -> Loom:
    app = Loom(storage, node="n1", clock=clock, timers=timers, recover=recover)

    @app.workflow(name="nap")
    async def nap(ctx: Context) -> str:
        await ctx.sleep(1)
        return "woke"

    return app


async def test_rows_due_by_the_batch_are_all_fired_before_the_service_sleeps() -> None:
    clock = GatedClock()
    storage = await open_storage("memory://")
    count = 2 * BATCH + 50
    async with napper(storage, clock, timers=False) as app:
        for i in range(count):
            await app.start("nap", id=f"n-{i:04d}")
        await app.drain()
    clock.at += timedelta(seconds=2)
    assert len(await storage.timers.due(clock.at, limit=10 * count)) == count
    async with napper(storage, clock, recover=False) as app:
        await clock.slept.wait()
        # Three polls (100, 100, 50 rows) and one sleep, after the last: a sleep after
        # each full batch would have left 150 rows due here.
        assert clock.sleeps == 1
        assert await storage.timers.due(clock.at, limit=10 * count) == ()
        await app.drain()
        done = [await app.get(f"n-{i:04d}").status() for i in range(count)]
        assert done == ["completed"] * count
        clock.gate.set()
    await storage.close()
