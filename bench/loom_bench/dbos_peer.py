"""DBOS as a peer: its one-step workflow, run beside ours against the same server.

DBOS (``pip install 'loom-bench[dbos]'``, DBOS Transact 3.4) keeps its workflows in a
system database; here that is a database of its own on the server the PostgreSQL rows use
(``<database>_loom_bench_dbos``), so both write to the same disk through the same server
settings. Each run launches DBOS (``DBOS(config=...)``, ``DBOS.launch()``: migrations and
its pool start-up, outside the clock), warms up, runs ``executions`` workflows with
``concurrency`` in flight, each ``DBOS.start_workflow_async`` under a fresh workflow id and
then ``await handle.get_result()``, and destroys DBOS again (and gives the event loop
back the default executor DBOS replaced with its own pool, which its destroy shuts down).

The workflow is the equivalent of ``workflow-one-step``: a ``@DBOS.workflow()`` whose body
awaits one ``@DBOS.step()`` returning ``{"ok": True}``. DBOS's pool is given one connection
per concurrent workflow (``sys_db_pool_size``, at least its default of 20), so it never
waits for a connection our side would not wait for; everything else is DBOS's default.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from loom_bench.drive import RunPlan, Tick, drive_concurrently
from loom_bench.scenarios import ScenarioError
from loom_bench.statistics import Sample
from loom_bench.workflows import RESULT, WorkflowScenario

__all__ = ["DBOS_INSTALL", "DBOS_LABEL", "dbos_missing", "measure_dbos"]

DBOS_LABEL: Final = "dbos"
DBOS_INSTALL: Final = "pip install 'loom-bench[dbos]'"
APP_NAME: Final = "loom-bench"
DEFAULT_POOL: Final = 20

_workflows: dict[str, Callable[[], Awaitable[Any]]] = {}


def dbos_missing() -> str | None:
    """None when DBOS is importable, else what to install."""
    if importlib.util.find_spec("dbos") is None:
        return DBOS_INSTALL
    return None


async def _step() -> dict[str, bool]:
    return {"ok": True}


def _one_step(dbos: Any) -> Callable[[], Awaitable[Any]]:
    """The one-step workflow, registered with DBOS once per process (its registry is
    global and outlives ``DBOS.destroy()``)."""
    workflow = _workflows.get("one-step")
    if workflow is None:
        step: Callable[[], Awaitable[Any]] = dbos.DBOS.step(name="loom_bench_step")(_step)

        async def one_step() -> Any:
            return await step()

        workflow = dbos.DBOS.workflow(name="loom_bench_one_step")(one_step)
        _workflows["one-step"] = workflow
    return workflow


async def measure_dbos(
    url: str, scenario: WorkflowScenario, plan: RunPlan, tick: Tick
) -> Sample:
    """One timed run of DBOS's equivalent of ``scenario`` with its system database at
    ``url`` (PostgreSQL here; any URL DBOS takes, e.g. ``sqlite:///...`` in the tests)."""
    if not scenario.peer:
        raise ValueError(f"{scenario.key} has no DBOS equivalent")
    dbos: Any = importlib.import_module("dbos")
    # DBOS logs every launch and shutdown at INFO, and warns when destroy() cancels its
    # own background tasks; the progress line is ours.
    logging.getLogger("dbos").setLevel(logging.ERROR)
    workflow = _one_step(dbos)
    config = {
        "name": APP_NAME,
        "system_database_url": url,
        "sys_db_pool_size": max(DEFAULT_POOL, plan.concurrency),
        "log_level": "ERROR",
    }
    loop = asyncio.get_running_loop()
    executor: Any = getattr(loop, "_default_executor", None)
    dbos.DBOS(config=config)
    try:
        dbos.DBOS.launch()

        async def execute(workflow_id: str) -> None:
            with dbos.SetWorkflowID(workflow_id):
                handle = await dbos.DBOS.start_workflow_async(workflow)
            result = await handle.get_result()
            if result != RESULT:
                raise ScenarioError(f"DBOS workflow {workflow_id!r} returned {result!r}")

        async def warm(index: int) -> None:
            await execute(plan.warmup_id(index))

        async def timed(index: int) -> None:
            await execute(plan.execution_id(index))

        if plan.warmup:
            await drive_concurrently(plan.warmup, plan.concurrency, warm)
        return await drive_concurrently(plan.executions, plan.concurrency, timed, tick)
    finally:
        dbos.DBOS.destroy()
        # DBOS makes its own thread pool the loop's default executor and shuts that pool
        # down when destroyed: every later asyncio.to_thread would fail.
        loop.set_default_executor(
            executor if isinstance(executor, ThreadPoolExecutor) else ThreadPoolExecutor()
        )
