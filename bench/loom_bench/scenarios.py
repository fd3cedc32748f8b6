"""The executions the table measures, as step scripts, and how Loom runs one.

A scenario is a short script of storage steps (an append, an unconditional acquire, a
conditional acquire). The same script drives our stores through the SPI
(:func:`run_execution`) and, in :mod:`loom_bench.raw_sqlite` / :mod:`loom_bench.raw_postgres`
/ :mod:`loom_bench.pgbench`, the bare-driver floors, so both sides write the same rows.

The five rows of the throughput table the harness reproduces (see docs/benchmarks.md):

- ``short``: start, one step, complete (three unfenced appends);
- ``short-fenced``: ``acquire_fence``, then the same three appends under the token;
- ``park-resume``: start, park, resume, complete (four unfenced appends);
- ``park-resume-fence``: start, park, then the resumer takes ``acquire_fence`` and writes
  the resume and the completion under it;
- ``park-resume-fence-if``: the same, but the resumer takes
  ``acquire_fence_if(fence=<the park's token>, park_seq=<the park's sequence>)``.

One more row measures what the ``fenced-append-cost`` target names, the appends alone:

- ``short-fenced-appends``: the three appends of ``short-fenced`` under a token the
  execution already holds; its ``acquire_fence`` is the scenario's *setup*, run for every
  execution id before the clock starts (as a runtime acquires once per ownership, then
  appends many times).

The park is written unfenced (token 0), as a parent parked by the supervisor's unfenced
first try is: an execution that was never fenced has token 0 (docs/design.md, "The log
and the fence").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from loom_core import EventStore, FenceAcquired, JsonValue, NewEvent
from loom_core.spi import OptionalMethod

__all__ = [
    "SCENARIOS",
    "AcquireFence",
    "AcquireFenceIf",
    "Append",
    "EventTemplate",
    "Scenario",
    "ScenarioError",
    "Step",
    "expected_log",
    "run_execution",
    "run_setup",
    "scenario",
]


@dataclass(frozen=True, slots=True)
class EventTemplate:
    """An event both sides write: the kind and the JSON payload."""

    kind: str
    payload: JsonValue


@dataclass(frozen=True, slots=True)
class Append:
    """Append one event at the next sequence; under the held token when ``fenced``."""

    event: EventTemplate
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class AcquireFence:
    """``acquire_fence``: take the next token unconditionally."""


@dataclass(frozen=True, slots=True)
class AcquireFenceIf:
    """``acquire_fence_if`` on the newest park: the token the park was written under and
    its sequence (the step needs a park earlier in the script)."""


Step: TypeAlias = Append | AcquireFence | AcquireFenceIf

START: Final = EventTemplate("EXECUTION_STARTED", {"workflow": "bench", "input": {"n": 1}})
STEP: Final = EventTemplate("STEP_COMPLETED", {"step": "one", "result": {"ok": True}})
PARK: Final = EventTemplate("EXECUTION_SUSPENDED", {"wait": {"signal": "go"}})
RESUME: Final = EventTemplate("EXECUTION_RESUMED", {"signal": "go", "value": {"ok": True}})
COMPLETE: Final = EventTemplate("EXECUTION_COMPLETED", {"result": {"ok": True}})


@dataclass(frozen=True, slots=True)
class Scenario:
    """One row's unit of work: ``steps`` run in order for each execution."""

    key: str
    title: str
    steps: tuple[Step, ...]
    setup: tuple[AcquireFence, ...] = ()
    """Run on every execution id before the clock starts (untimed, not counted)."""

    @property
    def appends(self) -> int:
        return sum(isinstance(step, Append) for step in self.steps)

    @property
    def held_token(self) -> int | None:
        """The token an execution holds when its timed steps begin: what the setup's
        acquires leave on a fresh id (None: no setup, nothing held)."""
        return len(self.setup) or None

    @property
    def setup_only(self) -> Scenario | None:
        """The setup as a scenario of its own, for a driver to run before the clock."""
        if not self.setup:
            return None
        return Scenario(f"{self.key}:setup", f"{self.title} (setup)", self.setup)

    @property
    def requires(self) -> frozenset[OptionalMethod]:
        """The optional SPI methods the script calls."""
        needed: set[OptionalMethod] = set()
        for step in (*self.setup, *self.steps):
            if isinstance(step, AcquireFence):
                needed.add("acquire_fence")
            elif isinstance(step, AcquireFenceIf):
                needed.add("acquire_fence_if")
        return frozenset(needed)

    @property
    def park_sequence(self) -> int | None:
        """The sequence of the script's last park, if it parks."""
        sequence, park = 0, None
        for step in self.steps:
            if isinstance(step, Append):
                if step.event.kind == PARK.kind:
                    park = sequence
                sequence += 1
        return park


SCENARIOS: Final[Mapping[str, Scenario]] = {
    s.key: s
    for s in (
        Scenario("short", "unfenced", (Append(START), Append(STEP), Append(COMPLETE))),
        Scenario(
            "short-fenced",
            "fenced",
            (
                AcquireFence(),
                Append(START, fenced=True),
                Append(STEP, fenced=True),
                Append(COMPLETE, fenced=True),
            ),
        ),
        Scenario(
            "short-fenced-appends",
            "fenced appends (token taken before the clock)",
            (
                Append(START, fenced=True),
                Append(STEP, fenced=True),
                Append(COMPLETE, fenced=True),
            ),
            setup=(AcquireFence(),),
        ),
        Scenario(
            "park-resume",
            "park/resume, unfenced",
            (Append(START), Append(PARK), Append(RESUME), Append(COMPLETE)),
        ),
        Scenario(
            "park-resume-fence",
            "park/resume under acquire_fence",
            (
                Append(START),
                Append(PARK),
                AcquireFence(),
                Append(RESUME, fenced=True),
                Append(COMPLETE, fenced=True),
            ),
        ),
        Scenario(
            "park-resume-fence-if",
            "park/resume under acquire_fence_if",
            (
                Append(START),
                Append(PARK),
                AcquireFenceIf(),
                Append(RESUME, fenced=True),
                Append(COMPLETE, fenced=True),
            ),
        ),
    )
}
"""Every scenario: the five rows of the table, with the fenced appends alone after its
fenced column."""


def scenario(key: str) -> Scenario:
    """The scenario named ``key``; refuses an unknown name, listing the known ones."""
    try:
        return SCENARIOS[key]
    except KeyError:
        raise ValueError(
            f"unknown scenario {key!r}; known: {', '.join(SCENARIOS)}"
        ) from None


class ScenarioError(RuntimeError):
    """A store refused a step of an uncontended execution (a benchmark must not be)."""


# Built once: a NewEvent is immutable, and the stores copy what they keep.
_NEW_EVENTS: Final[dict[str, tuple[EventTemplate, tuple[NewEvent, ...]]]] = {
    template.kind: (template, (NewEvent(template.kind, template.payload),))
    for template in (START, STEP, PARK, RESUME, COMPLETE)
}


def _batch(template: EventTemplate) -> tuple[NewEvent, ...]:
    cached = _NEW_EVENTS.get(template.kind)
    if cached is not None and cached[0] is template:
        return cached[1]
    return (NewEvent(template.kind, template.payload),)


async def run_execution(events: EventStore, execution_id: str, scenario: Scenario) -> None:
    """Run one execution of ``scenario`` through the SPI.

    Every execution id is fresh and driven by one task, so nothing may refuse: a stale
    conditional acquire raises :class:`ScenarioError` rather than being counted. The
    scenario's setup must have run on ``execution_id`` first (see :func:`run_setup`).
    """
    sequence = 0
    token = scenario.held_token
    park_token = 0
    park_sequence = -1
    for step in scenario.steps:
        if isinstance(step, Append):
            batch = _batch(step.event)
            fence = token if step.fenced else None
            await events.append(execution_id, batch, expected_sequence=sequence, fence=fence)
            if step.event.kind == PARK.kind:
                park_token, park_sequence = fence or 0, sequence
            sequence += 1
        elif isinstance(step, AcquireFence):
            token = await events.acquire_fence(execution_id)
        else:
            outcome = await events.acquire_fence_if(
                execution_id, fence=park_token, park_seq=park_sequence
            )
            if not isinstance(outcome, FenceAcquired):
                raise ScenarioError(
                    f"acquire_fence_if({execution_id!r}, fence={park_token}, "
                    f"park_seq={park_sequence}) was stale (token {outcome.fence}) on an "
                    "uncontended execution"
                )
            token = outcome.fence


async def run_setup(events: EventStore, execution_id: str, scenario: Scenario) -> None:
    """Run the scenario's untimed setup on ``execution_id`` (nothing when it has none)."""
    setup = scenario.setup_only
    if setup is not None:
        await run_execution(events, execution_id, setup)


def expected_log(scenario: Scenario) -> tuple[tuple[str, int], ...]:
    """The (kind, fence token) of each event one execution of ``scenario`` (after its
    setup) leaves; an unfenced append reads as token 0. Lets a test check what a floor or
    a store wrote."""
    token = len(scenario.setup)
    held = scenario.held_token
    log: list[tuple[str, int]] = []
    for step in scenario.steps:
        if isinstance(step, Append):
            log.append((step.event.kind, held if step.fenced and held is not None else 0))
        else:
            token += 1
            held = token
    return tuple(log)
