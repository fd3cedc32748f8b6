"""``handle.result()`` wakes on a write that lands between its read and its wait."""

from __future__ import annotations

import asyncio

from loom_runtime import Context, Loom
from loom_runtime.fold import View


async def test_a_completion_between_the_handles_read_and_its_wait_wakes_it(app: Loom) -> None:
    gate = asyncio.Event()

    async def slow() -> int:
        await gate.wait()
        return 7

    @app.workflow()
    async def flow(ctx: Context) -> int:
        return await ctx.step(slow)

    handle = await app.start(flow, id="between")
    read = app.inspect
    waits: list[bool] = []

    async def read_then_complete(execution_id: str) -> View:
        view = await read(execution_id)
        if view.status == "running":
            gate.set()
            await app.drain()  # the run writes its completion now, after the read
        return view

    wait = app.wait_changed

    async def record_wait(
        execution_id: str, seconds: float, signal: asyncio.Event | None = None
    ) -> None:
        waits.append(signal is not None and signal.is_set())
        await wait(execution_id, seconds, signal)

    async def not_waiting_for_the_run(execution_id: str, seconds: float | None) -> None:
        return None  # take the path of a run driven elsewhere: read the log, then wait

    app._local_end = not_waiting_for_the_run  # type: ignore[method-assign]
    app.inspect = read_then_complete  # type: ignore[method-assign]
    app.wait_changed = record_wait  # type: ignore[method-assign]
    assert await handle.result(timeout=5) == 7
    assert waits == [True]  # the wait began already woken: the completion was not missed
