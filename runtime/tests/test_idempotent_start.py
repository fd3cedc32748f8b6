"""``if_exists="attach"``: a start onto an id that has an execution of the same workflow
gives that execution's handle (or, through ``execute``, its result) and writes nothing."""

from __future__ import annotations

import asyncio

import pytest
from loom_runtime import Context, Loom
from store_probes import ProbedEventStore

from loom_core import (
    EventKind,
    ExecutionAlreadyExistsError,
    InvalidInputError,
    Storage,
    open_storage,
)


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
    assert "attaches only to an execution of the same workflow" in str(caught.value)


async def test_a_start_attaches_to_its_function_under_an_older_name(app: Loom) -> None:
    async def body(ctx: Context) -> object:
        return await ctx.receive("go")

    app.workflow(name="approve.v1")(body)
    first = await app.start("approve.v1", id="r")
    app.workflow(name="approve.v2")(body)  # the new name: starts use it from now on
    again = await app.start(body, id="r", if_exists="attach")
    assert again.execution_id == first.execution_id
    await app.send("r", "go", 1)
    assert await again.result(timeout=5) == 1
    assert [e.kind for e in await app.storage.events.read("r")].count(
        EventKind.EXECUTION_STARTED
    ) == 1


async def test_a_start_without_attach_is_refused_as_before(app: Loom) -> None:
    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    await app.execute(quick, id="r")
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.start(quick, id="r")
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.start(quick, id="r", if_exists="raise")


async def test_a_refused_start_says_how_to_attach_to_the_execution_there(app: Loom) -> None:
    """A DBOS or Temporal user expects a start onto a used id to hand back that
    execution: the refusal names the option that does."""

    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    await app.execute(quick, id="r")
    log = await app.storage.events.read("r")
    with pytest.raises(ExecutionAlreadyExistsError) as started:
        await app.start(quick, id="r")
    assert "if_exists='attach'" in str(started.value)
    assert "app.start" in str(started.value)
    with pytest.raises(ExecutionAlreadyExistsError) as executed:
        await app.execute(quick, id="r")
    assert "if_exists='attach'" in str(executed.value)
    assert "app.execute" in str(executed.value)
    await app.fork("r", id="r-2")
    with pytest.raises(ExecutionAlreadyExistsError) as forked:
        await app.fork("r", id="r-2")
    assert "if_exists='attach'" in str(forked.value)
    assert started.value.execution_id == "r"
    assert forked.value.execution_id == "r-2"
    assert await app.storage.events.read("r") == log


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
            await call(quick, id=id_, if_exists=if_exists)  # type: ignore[call-overload, call-arg]
    assert [v async for v in app.executions()] == []


async def test_a_start_that_fences_out_the_creator_of_a_reused_id_carries_it_on() -> None:
    """Two nodes start an id whose earlier execution was deleted. B finds no log and is
    held before it takes a newer token; A creates the log meanwhile, under an older token
    than B then takes, so B's token fences A's run out. B is refused as for any id that
    exists, and carries the execution on: it finishes, driven by B."""
    ran: list[str] = []
    gate = asyncio.Event()
    gate.set()
    a_charging = asyncio.Event()

    async def charge(node: str) -> str:
        ran.append(node)
        if node == "a":
            a_charging.set()
        await gate.wait()
        return "charged"

    def register(app: Loom, node: str) -> None:
        @app.workflow(name="order")
        async def order(ctx: Context) -> str:
            return await ctx.step(charge, node, name="charge")

    base = await open_storage("memory://")
    probe = ProbedEventStore(base.events)
    for_b = Storage(probe, base.timers, base.leases, url=base.url)
    a = Loom(base, node="a", recover=False)
    b = Loom(for_b, node="b", recover=False)
    register(a, "a")
    register(b, "b")
    held, go_on = asyncio.Event(), asyncio.Event()

    async def hold(execution_id: str) -> None:
        held.set()
        await go_on.wait()

    async with a, b:
        await a.execute("order", id="o")  # then deleted: its token outlives the log
        gate.clear()
        ran.clear()
        assert await base.events.delete_execution("o")
        probe.before_acquire = hold
        started_b = asyncio.ensure_future(b.start("order", id="o", if_exists="attach"))
        await held.wait()  # B found no log, and is about to take a token
        await a.start("order", id="o")  # A creates the log under the older token
        await a_charging.wait()  # A's run is in its step, holding the older token
        go_on.set()
        handle = await started_b  # refused as existing: attached
        gate.set()
        assert await handle.result(timeout=5) == "charged"
        await a.drain()
        log = await base.events.read("o")
        assert [e.kind for e in log].count(EventKind.EXECUTION_STARTED) == 1
        assert any(
            e.kind == EventKind.EXECUTION_RECOVERED and e.payload["node"] == "b"  # type: ignore[index,call-overload]
            for e in log
        )
        assert ran == ["a", "b"]  # B's run took the step on; A's was fenced out
    await base.close()
