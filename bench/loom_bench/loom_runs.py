"""Our side of a row: the scenario through ``open_storage(url, decorators=…)`` and the SPI.

Nothing here knows a backend: the storage is whatever the installed plugin registered for
the URL's scheme, wrapped by the stack's decorators, opened fresh for each run (opening,
schema checks and pool start-up happen before the clock starts) and closed after it.
"""

from __future__ import annotations

from collections.abc import Sequence

from loom_bench.backends import Backend
from loom_bench.drive import RunPlan, Tick, drive_concurrently
from loom_bench.scenarios import Scenario, run_execution, run_setup
from loom_bench.stacks import StackOpening
from loom_bench.statistics import Sample
from loom_core import open_storage
from loom_core.spi import PluginHost

__all__ = ["NotOffered", "measure_loom"]


class NotOffered(Exception):
    """The store (after its decorators) does not offer a method the scenario calls."""


async def measure_loom(
    backend: Backend,
    stack: Sequence[str],
    scenario: Scenario,
    plan: RunPlan,
    tag: str,
    tick: Tick,
    plugins: PluginHost,
) -> Sample:
    """One timed run of ``scenario`` on a fresh storage of ``backend`` under ``stack``.

    Raises :class:`NotOffered` before any write when the decorated store lacks a method
    the scenario needs (e.g. a store without ``acquire_fence_if``).
    """
    opening = StackOpening(backend, tag, plugins)
    try:
        specs = await opening.specs(stack)
        async with open_storage(
            backend.storage_url(tag), decorators=specs, options=backend.options, plugins=plugins
        ) as storage:
            events = storage.events
            missing = sorted(scenario.requires - events.capabilities)
            if missing:
                raise NotOffered(f"the store does not offer {', '.join(missing)}")

            async def warm(index: int) -> None:
                await run_setup(events, plan.warmup_id(index), scenario)
                await run_execution(events, plan.warmup_id(index), scenario)

            async def set_up(index: int) -> None:
                await run_setup(events, plan.execution_id(index), scenario)

            async def timed(index: int) -> None:
                await run_execution(events, plan.execution_id(index), scenario)

            if plan.warmup:
                await drive_concurrently(plan.warmup, plan.concurrency, warm)
            if scenario.setup:
                await drive_concurrently(plan.executions, plan.concurrency, set_up)
            return await drive_concurrently(plan.executions, plan.concurrency, timed, tick)
    finally:
        await opening.close()
