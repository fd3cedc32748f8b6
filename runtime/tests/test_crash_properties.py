"""Drawn workflows killed at drawn points finish exactly once, with the app's own timer
loop and recovery running beside the test's moves (see
:mod:`loom_conformance.drawn_workflows` for the plans and every check).

On ``memory://`` an example runs the same way every time (one event loop, a virtual clock,
a seeded random, async steps only) and ``derandomize`` makes the examples the same on every
run. On SQLite the store's writer thread takes part too; the checks hold whatever the
order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from loom_conformance.drawn_workflows import (
    CHOSEN,
    WORKFLOW,
    Plan,
    _Killed,
    check_plan,
    drawn_app,
    plans,
    with_chosen_plans,
)
from loom_runtime import Loom

NODE = "n1"


async def run(url: str, plan: Plan) -> tuple[int, int]:
    async with drawn_app(url, node=NODE, services=True) as drawn:
        return await check_plan(drawn, plan, "x")


@settings(
    max_examples=300,
    deadline=None,  # never a duration: only what the run did is checked
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=plans())
@with_chosen_plans
def test_a_drawn_workflow_killed_at_drawn_points_finishes_exactly_once(plan: Plan) -> None:
    fired, parked = asyncio.run(run("memory://", plan))
    event(f"crashes fired: {fired}")
    event(f"parks: {parked}")


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plan=plans())
@with_chosen_plans
def test_a_drawn_workflow_on_sqlite_finishes_exactly_once(tmp_path: Path, plan: Plan) -> None:
    database = tmp_path / "loom.db"
    database.unlink(missing_ok=True)
    for leftover in tmp_path.glob("loom.db-*"):
        leftover.unlink()
    asyncio.run(run(f"sqlite:///{database}", plan))


def test_a_node_restarted_after_each_crash_is_a_new_app_that_carries_on(tmp_path: Path) -> None:
    """The chosen plan that restarts its nodes: every crash replaced the node it hit by a
    new app (on SQLite, with the file opened again), and the checks held."""
    (plan,) = [p for p in CHOSEN if p.restart]

    async def play() -> tuple[int, int, set[int]]:
        url = f"sqlite:///{tmp_path / 'loom.db'}"
        # The test polls both nodes' timers, so which node answers each park, and so which
        # one each crash hits, is the same on every run.
        async with drawn_app(url, node=NODE, services=False) as drawn:
            first = drawn.nodes
            fired, _ = await check_plan(drawn, plan, "x")
            pairs = enumerate(zip(first, drawn.nodes, strict=True))
            replaced = {i for i, (was, now) in pairs if was is not now}
            return fired, drawn.restarts, replaced

    fired, restarts, replaced = asyncio.run(play())
    assert fired == len(plan.crashes)
    assert restarts == fired
    assert replaced == {0, 1}


@pytest.mark.parametrize("plan", [p for p in CHOSEN if p.kill is not None])
def test_a_node_killed_at_a_store_call_is_restarted_and_its_run_carried_on(plan: Plan) -> None:
    async def play() -> tuple[bool, int]:
        async with drawn_app("memory://", node=NODE, services=False) as drawn:
            await check_plan(drawn, plan, "x")
            return drawn.deaths.killed, drawn.restarts

    killed, restarts = asyncio.run(play())
    assert killed
    assert restarts == 1


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_node_killed_at_a_store_call_reaches_the_store_no_more(when: str) -> None:
    """The drawn plans' process death: the call that kills lands or not as drawn, and
    nothing the dead node asks of its store reaches it."""

    async def play() -> None:
        async with drawn_app("memory://", node=NODE, services=False) as drawn:
            dead, alive = drawn.app, drawn.peer
            drawn.deaths.arm((0, "before" if when == "before" else "after"))
            with pytest.raises(_Killed):
                await dead.start(WORKFLOW, [["step", 0]], id="k")
            assert drawn.dead() == [0]
            landed = await alive.storage.events.read("k")
            assert [e.kind for e in landed] == ([] if when == "before" else ["EXECUTION_STARTED"])
            with pytest.raises(_Killed):
                await dead.storage.events.read("k")
            with pytest.raises(_Killed):
                await dead.start(WORKFLOW, [["step", 0]], id="k2")
            assert await alive.storage.events.read("k2") == ()
            restarted = await drawn.restart(0)
            assert isinstance(restarted, Loom)
            assert drawn.dead() == []
            if when == "after":
                assert [h.execution_id for h in await restarted.recover()] == ["k"]
                assert await restarted.get("k").result() == ["v0"]

    asyncio.run(play())
