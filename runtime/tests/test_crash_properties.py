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

from hypothesis import HealthCheck, event, given, settings
from loom_conformance.drawn_workflows import (
    CHOSEN,
    Plan,
    check_plan,
    drawn_app,
    plans,
    with_chosen_plans,
)

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
