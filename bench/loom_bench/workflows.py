"""The workflow rows: a workflow through ``loom_runtime``, beside the store making its calls.

Each row is one workflow, run by the runtime over the harness's storage
(``Loom(storage, node="bench", recover=False, timers=False)``, entered with ``async with``),
one execution per ``await app.start(workflow, id=...)`` then ``await handle.result()``
(``call="start"``, the default), or per ``await app.execute(workflow, id=...)``, which
drives the body in the calling task (``call="execute"``):

- ``workflow-one-step``: one step, then the step's result as the workflow's;
- ``workflow-three-steps``: three steps, one after another;
- ``workflow-sleep``: ``await ctx.sleep(0)``, a park and a resume, then a result.

Beside it, in the same repetition, its **twin**: the store-level execution that makes
exactly the calls the runtime makes, call for call, with the same payloads (the same kinds,
keys, fences and batches), and nothing else. For the steps rows: EXECUTION_STARTED at 0 with
``fence=0``, each STEP_COMPLETED but the last as its own append under fence 0 (written
before the next step runs), and the last one in one append with EXECUTION_COMPLETED (a
result is written with the run's next write). For the sleep: EXECUTION_STARTED, the timer
row's ``schedule``, EXECUTION_SUSPENDED; then ``acquire_fence_if(fence=0, park_seq=1)``, the
tail read from sequence 2, EXECUTION_RESUMED under token 1, the timer row's ``complete``,
EXECUTION_COMPLETED under token 1, and the ``cancel`` of the execution's timer rows the
runtime makes when an execution that waited on a timer ends. The runtime over its twin is
what running a workflow costs beyond the store writes it needs.

The timer service is off on both sides: a zero-length sleep is due when it parks, and the
run answers its own park at once, so the service would only poll (and race that resume).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal, TypeAlias, get_args

from loom_bench.backends import Backend
from loom_bench.drive import RunPlan, Tick, drive_concurrently
from loom_bench.loom_runs import NotOffered
from loom_bench.scenarios import ScenarioError
from loom_bench.statistics import Sample
from loom_core import (
    EventStore,
    FenceAcquired,
    JsonObject,
    NewEvent,
    Storage,
    TimerRecord,
    open_storage,
)
from loom_core.spi import OptionalMethod, PluginHost

__all__ = [
    "NODE",
    "RUNTIME_INSTALL",
    "WORKFLOWS",
    "WORKFLOW_CALLS",
    "WorkflowCall",
    "WorkflowScenario",
    "Execute",
    "check_workflow_call",
    "measure_workflow",
    "run_twin",
    "runtime_executor",
    "runtime_missing",
    "twin_executor",
    "workflow_scenario",
]

NODE: Final = "bench"
WorkflowCall: TypeAlias = Literal["start", "execute"]
WORKFLOW_CALLS: Final[tuple[WorkflowCall, ...]] = get_args(WorkflowCall)


def check_workflow_call(call: object, what: str) -> None:
    """Refuse a ``call`` (named ``what`` in the message) that is not a workflow call."""
    if call not in WORKFLOW_CALLS:
        raise ValueError(f"{what} must be one of {', '.join(WORKFLOW_CALLS)}, not {call!r}")
RUNTIME_INSTALL: Final = "pip install -e runtime"
RESULT: Final[JsonObject] = {"ok": True}
# What the runtime records for a call site ("file:line") and a body's code digest
# (16 hex digits): the twin writes strings of the same shape.
_SITE: Final = "workflows.py:100"
_FINGERPRINT: Final = "0123456789abcdef"


@dataclass(frozen=True, slots=True)
class WorkflowScenario:
    """One workflow row: ``steps`` steps one after another, or a zero-length sleep."""

    key: str
    title: str
    steps: int = 0
    sleeps: bool = False
    peer: bool = False
    """DBOS runs the same workflow beside it (on PostgreSQL)."""

    @property
    def workflow(self) -> str:
        """The workflow's registered name (what its EXECUTION_STARTED records)."""
        return self.key.removeprefix("workflow-")

    @property
    def appends(self) -> int:
        return 2 + self.steps + (2 if self.sleeps else 0)

    @property
    def requires(self) -> frozenset[OptionalMethod]:
        """The optional SPI methods its calls need (the resume's conditional acquire)."""
        return frozenset({"acquire_fence_if"}) if self.sleeps else frozenset()


WORKFLOWS: Final[Mapping[str, WorkflowScenario]] = {
    w.key: w
    for w in (
        WorkflowScenario("workflow-one-step", "one-step workflow", steps=1, peer=True),
        WorkflowScenario("workflow-three-steps", "three-step workflow", steps=3),
        WorkflowScenario(
            "workflow-sleep", "workflow with a zero-length sleep (park and resume)",
            sleeps=True,
        ),
    )
}
"""Every workflow row."""


def workflow_scenario(key: str) -> WorkflowScenario | None:
    return WORKFLOWS.get(key)


def runtime_missing() -> str | None:
    """None when loom_runtime is importable, else what to install."""
    if importlib.util.find_spec("loom_runtime") is None:
        return RUNTIME_INSTALL
    return None


# -- the runtime side ------------------------------------------------------------------------


async def _step() -> JsonObject:
    return {"ok": True}


Execute = Callable[[str], Awaitable[None]]


def _body(scenario: WorkflowScenario) -> Callable[..., Awaitable[object]]:
    from loom_runtime import Context

    steps = scenario.steps
    sleeps = scenario.sleeps

    async def body(ctx: Context) -> object:
        result: object = RESULT
        if sleeps:
            await ctx.sleep(0)
        for index in range(steps):
            result = await ctx.step(_step, name=f"step-{index}")
        return result

    return body


@contextlib.asynccontextmanager
async def runtime_executor(
    storage: Storage, scenario: WorkflowScenario, call: WorkflowCall = "start"
) -> AsyncIterator[Execute]:
    """An entered ``Loom`` app over ``storage`` with the scenario's workflow registered;
    ``execute(id)`` runs one execution to its result (refusing any other result) through
    ``app.start`` and ``handle.result()``, or through ``app.execute`` (``call``)."""
    from loom_runtime import Loom

    check_workflow_call(call, "call")
    app = Loom(storage, node=NODE, recover=False, timers=False)
    workflow = app.workflow(name=scenario.workflow)(_body(scenario))

    async def execute(execution_id: str) -> None:
        if call == "execute":
            result = await app.execute(workflow, id=execution_id)
        else:
            handle = await app.start(workflow, id=execution_id)
            result = await handle.result()
        if result != RESULT:
            raise ScenarioError(f"workflow {execution_id!r} returned {result!r}")

    async with app:
        yield execute


@contextlib.asynccontextmanager
async def twin_executor(storage: Storage, scenario: WorkflowScenario) -> AsyncIterator[Execute]:
    """``execute(id)`` runs one execution of the scenario's twin on ``storage``."""

    async def execute(execution_id: str) -> None:
        await run_twin(storage, execution_id, scenario)

    yield execute


Executor = Callable[[Storage, WorkflowScenario], contextlib.AbstractAsyncContextManager[Execute]]


async def measure_workflow(
    executor: Executor,
    backend: Backend,
    scenario: WorkflowScenario,
    plan: RunPlan,
    tag: str,
    tick: Tick,
    plugins: PluginHost,
) -> Sample:
    """One timed run of ``scenario`` by ``executor`` (:func:`runtime_executor` or
    :func:`twin_executor`) on a fresh storage of ``backend``, after its warm-up.

    Raises :class:`~loom_bench.loom_runs.NotOffered` before any write when the store lacks
    a method the workflow's calls need.
    """
    async with open_storage(
        backend.storage_url(tag), options=backend.options, plugins=plugins
    ) as storage:
        missing = sorted(scenario.requires - storage.events.capabilities)
        if missing:
            raise NotOffered(f"the store does not offer {', '.join(missing)}")
        async with executor(storage, scenario) as execute:

            async def warm(index: int) -> None:
                await execute(plan.warmup_id(index))

            async def timed(index: int) -> None:
                await execute(plan.execution_id(index))

            if plan.warmup:
                await drive_concurrently(plan.warmup, plan.concurrency, warm)
            return await drive_concurrently(plan.executions, plan.concurrency, timed, tick)


# -- the twin ----------------------------------------------------------------------------------


def _started(scenario: WorkflowScenario, execution_id: str) -> NewEvent:
    return NewEvent(
        "EXECUTION_STARTED",
        {
            "workflow": scenario.workflow,
            "input": [],
            "fingerprint": _FINGERPRINT,
            "node": NODE,
            "root": execution_id,
            "generation": 0,
            "continued_from": None,
            "parent": None,
        },
    )


def _step_completed(index: int) -> NewEvent:
    return NewEvent(
        "STEP_COMPLETED",
        {
            "position": [index],
            "call": "step",
            "name": f"step-{index}",
            "result": {"ok": True},
            "attempt": 1,
            "site": _SITE,
        },
    )


def _suspended(wake_at: datetime) -> NewEvent:
    wait: JsonObject = {
        "position": [0], "call": "sleep", "wake_at": wake_at.isoformat(), "site": _SITE,
    }
    return NewEvent("EXECUTION_SUSPENDED", {"waits": [wait]})


def _resumed(park_seq: int) -> NewEvent:
    return NewEvent(
        "EXECUTION_RESUMED",
        {
            "park": park_seq,
            "position": [0],
            "answer": {"kind": "timer"},
            "node": NODE,
            "fingerprint": _FINGERPRINT,
        },
    )


def _completed() -> NewEvent:
    return NewEvent("EXECUTION_COMPLETED", {"result": {"ok": True}})


async def run_twin(storage: Storage, execution_id: str, scenario: WorkflowScenario) -> None:
    """One execution of ``scenario``'s twin: the runtime's store calls, and only those."""
    events: EventStore = storage.events
    await events.append(
        execution_id, (_started(scenario, execution_id),), expected_sequence=0, fence=0
    )
    sequence, token = 1, 0
    if scenario.sleeps:
        wake_at = datetime.now(UTC)
        await storage.timers.schedule(TimerRecord(execution_id, wake_at))
        park = sequence
        await events.append(
            execution_id, (_suspended(wake_at),), expected_sequence=park, fence=token
        )
        outcome = await events.acquire_fence_if(execution_id, fence=token, park_seq=park)
        if not isinstance(outcome, FenceAcquired):
            raise ScenarioError(
                f"acquire_fence_if({execution_id!r}, fence={token}, park_seq={park}) was "
                f"stale (token {outcome.fence}) on an uncontended execution"
            )
        token = outcome.fence
        tail = await events.read(execution_id, from_sequence=park + 1)
        sequence = park + 1 + len(tail)
        await events.append(
            execution_id, (_resumed(park),), expected_sequence=sequence, fence=token
        )
        sequence += 1
        await storage.timers.complete(execution_id, wake_at)
    # Each step's result is written before the next step runs; the last one with the end.
    last: tuple[NewEvent, ...] = ()
    for index in range(scenario.steps):
        if last:
            await events.append(execution_id, last, expected_sequence=sequence, fence=token)
            sequence += 1
        last = (_step_completed(index),)
    await events.append(
        execution_id, (*last, _completed()), expected_sequence=sequence, fence=token
    )
    if scenario.sleeps:
        await storage.timers.cancel(execution_id)
