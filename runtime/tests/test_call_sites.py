"""Each recorded call names the line of the body that made it (``file:line``), the same
line every time that line runs, and the body's line for a call made inside a gather."""

from __future__ import annotations

import inspect

from loom_runtime import Context, Loom

from loom_core import EventKind


async def double(n: int) -> int:
    return 2 * n


def _line_of(fn: object, marker: str) -> str:
    lines, first = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    (index,) = [i for i, line in enumerate(lines) if marker in line]
    return f"test_call_sites.py:{first + index}"


async def test_each_call_records_its_own_line_and_a_loop_records_one_line_each_time(
    app: Loom,
) -> None:
    async def body(ctx: Context) -> int:
        total = await ctx.step(double, 1)  # site: first
        for n in range(2):
            total += await ctx.step(double, n)  # site: loop
        pair = await ctx.gather(ctx.step(double, 3), ctx.step(double, 4))  # site: gather
        total += await helper(ctx)
        return total + sum(pair)

    async def helper(ctx: Context) -> int:
        return await ctx.step(double, 5)  # site: helper

    app.workflow(name="sites")(body)
    for run in ("first", "second"):  # the second run's sites come from what the first kept
        handle = await app.start("sites", id=f"sites-{run}")
        assert await handle.result(timeout=5) == 2 + 0 + 2 + 6 + 8 + 10
        sites = [
            e.payload["site"]  # type: ignore[call-overload, index]
            for e in await app.storage.events.read(f"sites-{run}")
            if e.kind == EventKind.STEP_COMPLETED
        ]
        first, loop, gather = (_line_of(body, f"# site: {m}") for m in ("first", "loop", "gather"))
        assert sites == [first, loop, loop, gather, gather, _line_of(helper, "# site: helper")]
