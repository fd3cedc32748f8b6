"""What a benchmark produced: rows of per-repetition samples, and their summaries.

Every figure the reports print is derived here from the raw samples, which the JSON keeps,
so a later commit can be compared run by run, not only by medians.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from loom_bench.statistics import Sample, Spread, paired_ratios, spread

__all__ = [
    "BenchResult",
    "Parameters",
    "RowKind",
    "RowResult",
    "RowSpec",
    "SideResult",
    "Status",
]

Status = Literal["ok", "not installed", "unavailable", "unsupported", "failed"]
"""``ok``: measured. ``not installed``: the backend or a decorator plugin is missing.
``unavailable``: installed but not reachable (no PostgreSQL server). ``unsupported``: the
store does not offer a method the scenario calls. ``failed``: a run raised."""


RowKind = Literal["store", "workflow", "stream"]
"""``store``: a step script through the SPI, beside the raw-driver floors. ``workflow``: a
workflow through ``loom_runtime``, beside the store making the same calls (its *floor*,
the ``raw`` side) and, where it has one, DBOS's equivalent (the *peer*, the ``ceiling``
side). ``stream``: one event-store write through the SPI, beside eventsourcing's
aggregate recorder (the ``raw`` side) and its application recorder (the ``ceiling``
side) writing the same events."""


@dataclass(frozen=True, slots=True)
class RowSpec:
    """One line of the table: a scenario on a backend, under a stack, at a concurrency."""

    backend: str
    scenario: str
    title: str
    stack: tuple[str, ...]
    concurrency: int
    kind: RowKind = "store"

    @property
    def key(self) -> str:
        stack = "+" + "+".join(self.stack) if self.stack else ""
        return f"{self.backend}/{self.scenario}{stack}@{self.concurrency}"

    @property
    def bare_key(self) -> str | None:
        """The undecorated row a stack row is compared with."""
        if not self.stack:
            return None
        return f"{self.backend}/{self.scenario}@{self.concurrency}"

    @property
    def label(self) -> str:
        return " + ".join(self.stack) if self.stack else self.title


@dataclass(frozen=True, slots=True)
class SideResult:
    """One side of a row (ours, the raw floor or pgbench): a sample per repetition,
    None where that repetition did not measure it."""

    label: str
    samples: tuple[Sample | None, ...]
    error: str | None = None
    note: str | None = None
    """Why the side has no figure when that is no failure (``not installed: ...``)."""

    @property
    def measured(self) -> tuple[Sample, ...]:
        return tuple(s for s in self.samples if s is not None)

    @property
    def throughput(self) -> Spread | None:
        values = [s.per_second for s in self.measured]
        return spread(values) if values else None

    @property
    def p50_ms(self) -> Spread | None:
        values = [s.p50_ms for s in self.measured]
        return spread(values) if values else None

    def per_second(self) -> list[float | None]:
        return [s.per_second if s is not None else None for s in self.samples]


@dataclass(frozen=True, slots=True)
class RowResult:
    """A row's outcome. ``note`` says why a row (or one of its sides) has no figure."""

    spec: RowSpec
    status: Status
    note: str | None = None
    ours: SideResult | None = None
    raw: SideResult | None = None
    ceiling: SideResult | None = None
    vs_bare: Spread | None = None

    @property
    def vs_raw(self) -> Spread | None:
        """Ours over the raw floor, paired per repetition."""
        return _paired(self.ours, self.raw)

    @property
    def vs_ceiling(self) -> Spread | None:
        """Ours over pgbench, paired per repetition."""
        return _paired(self.ours, self.ceiling)


def _paired(top: SideResult | None, bottom: SideResult | None) -> Spread | None:
    if top is None or bottom is None:
        return None
    return paired_ratios(top.per_second(), bottom.per_second())


@dataclass(frozen=True, slots=True)
class Parameters:
    """How the benchmark was run (the JSON keeps them beside the figures)."""

    backends: tuple[str, ...]
    concurrency: tuple[int, ...]
    executions: int
    runs: int
    warmup: int
    scenarios: tuple[str, ...]
    stacks: tuple[tuple[str, ...], ...]
    stack_scenario: str
    sqlite_synchronous: str
    postgres: str
    command: str
    workflow_call: str = "start"


@dataclass(frozen=True, slots=True)
class BenchResult:
    """A whole benchmark: parameters, machine, settings per backend, and the rows."""

    parameters: Parameters
    machine: Mapping[str, object]
    settings: Mapping[str, Mapping[str, object]]
    rows: tuple[RowResult, ...]
    started_at: str
    finished_at: str

    def row(self, key: str) -> RowResult | None:
        for row in self.rows:
            if row.spec.key == key:
                return row
        return None
