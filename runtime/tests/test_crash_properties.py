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
