"""``if_exists="attach"``: a start onto an id that has an execution of the same workflow
gives that execution's handle (or, through ``execute``, its result) and writes nothing."""

from __future__ import annotations

import asyncio

import pytest
from loom_runtime import Context, Loom

from loom_core import ExecutionAlreadyExistsError, InvalidInputError


async def test_a_second_start_attaches_to_the_first_and_the_body_runs_once(app: Loom) -> None:
    charged: list[int] = []

    async def charge(n: int) -> int:
        charged.append(n)
        return n

    @app.workflow()
    async def order(ctx: Context, n: int) -> object:
        await ctx.step(charge, n)
        got = await ctx.receive("paid")
        return [n, got]

    first = await app.start(order, 1, id="o-1")
    await app.drain()
    log = await app.storage.events.read("o-1")
    # The arguments are not compared: the id names the execution.
    second = await app.start(order, 2, id="o-1", if_exists="attach")
    assert second.execution_id == "o-1"
    assert await app.storage.events.read("o-1") == log  # nothing written
    await app.send("o-1", "paid", True)
    assert await second.result(timeout=5) == [1, True]
    assert await first.result(timeout=5) == [1, True]
    assert charged == [1]


async def test_execute_attaches_and_waits_for_the_result(app: Loom) -> None:
    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    assert await app.execute(quick, id="q") == "done"
    assert await app.execute(quick, id="q", if_exists="attach") == "done"
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.execute(quick, id="q")


async def test_two_concurrent_attaching_starts_make_one_execution(app: Loom) -> None:
    runs: list[int] = []

    @app.workflow()
    async def once(ctx: Context) -> int:
        runs.append(1)
        return len(runs)

    handles = await asyncio.gather(
        *(app.start(once, id="c", if_exists="attach") for _ in range(5))
    )
    assert {h.execution_id for h in handles} == {"c"}
    assert [await h.result(timeout=5) for h in handles] == [1] * 5
    assert runs == [1]


async def test_another_workflow_at_the_id_is_still_refused(app: Loom) -> None:
    @app.workflow()
    async def first(ctx: Context) -> str:
        return "first"

    @app.workflow()
    async def second(ctx: Context) -> str:
        return "second"

    await app.execute(first, id="w")
    with pytest.raises(ExecutionAlreadyExistsError) as caught:
        await app.start(second, id="w", if_exists="attach")
    assert any("attaches only to an execution of the same workflow" in n
               for n in caught.value.__notes__)


async def test_a_start_without_attach_is_refused_as_before(app: Loom) -> None:
    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    await app.execute(quick, id="r")
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.start(quick, id="r")
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.start(quick, id="r", if_exists="raise")


@pytest.mark.parametrize(
    ("if_exists", "id_", "says"),
    [
        ("attach", None, "needs id="),
        ("replace", "x", "'raise'"),
        (True, "x", "'raise'"),
    ],
)
async def test_a_bad_if_exists_is_refused_and_nothing_is_written(
    app: Loom, if_exists: object, id_: str | None, says: str
) -> None:
    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    for call in (app.start, app.execute):
        with pytest.raises(InvalidInputError, match=says):
            await call(quick, id=id_, if_exists=if_exists)  # type: ignore[call-overload]
    assert [v async for v in app.executions()] == []
