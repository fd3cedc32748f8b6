"""The backends' performance targets, checked against a benchmark's rows.

Each target is named for what it measures (the report prints the name):

- ``sqlite-vs-raw``: every SQLite row at least 0.7x of the raw ``sqlite3`` loop doing the
  same writes in the same run.
- ``conditional-resume-cost``: on PostgreSQL, the park/resume under ``acquire_fence_if``
  costs at most 10% over the one under ``acquire_fence``.
- ``fenced-append-cost``: on PostgreSQL, fenced appends cost at most 10% over unfenced
  ones (the ``short-fenced-appends`` row: the same three appends under a token taken
  before the clock).
- ``vs-pgbench``: on PostgreSQL, short executions at 64 concurrent at least 0.8x of
  pgbench running the same three transactions against the same server.
- ``workflow-runtime-cost``: on every backend, a workflow through ``loom_runtime`` costs
  at most 25% over the store making the same calls (its twin, in the same run).
- ``vs-dbos``: on PostgreSQL, one-step workflows/s through the runtime at 64 concurrent at
  least 20x of DBOS running its equivalent one-step workflow against the same server.
- ``vs-eventsourcing``: on SQLite and PostgreSQL, at every concurrency, each stream row
  (a new stream of three events; one event appended to a stream) at least 1.0x of each of
  eventsourcing's recorders (aggregate, application) writing the same events in the same
  run, on the same server or disk.
- ``decorator-cost``: on every backend, a row under one of the project's decorators at
  least 0.9x (``tenant``, ``sharded``) or 0.7x (``crypto``, ``audit``) of the same row on
  the undecorated store, in the same run. A stack of several decorators, or of one this
  list does not name, is printed without a target.

Beside them, for reference and without a threshold, ``fenced-execution-cost``: the cost
of the ``short-fenced`` row (whose ``acquire_fence`` is a fourth write inside every timed
execution, as in the "fenced" column of the table the harness reproduces) over ``short``.

A cost "over" another row is ``their throughput / ours - 1`` (the extra time per
execution), paired per repetition. A target is judged on the median's confidence
interval (:func:`loom_bench.statistics.median_interval`): **met** when the whole interval
meets it, **not met** when none of it does, and **undecided** when the interval straddles
the threshold, i.e. the runs are too noisy, or too few, to tell; more ``--runs`` narrow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from loom_bench.results import BenchResult, RowResult
from loom_bench.statistics import Spread, paired_ratios
from loom_bench.workflows import WORKFLOWS

__all__ = ["TargetCheck", "Verdict", "evaluate"]

SQLITE_FLOOR_RATIO: Final = 0.7
POSTGRES_OVERHEAD: Final = 0.10
PGBENCH_RATIO: Final = 0.8
PGBENCH_CONCURRENCY: Final = 64
RUNTIME_OVERHEAD: Final = 0.25
DBOS_RATIO: Final = 20.0
DBOS_CONCURRENCY: Final = 64
EVENTSOURCING_RATIO: Final = 1.0
EVENTSOURCING_BACKENDS: Final = ("sqlite", "postgres")
DECORATOR_RATIOS: Final[Mapping[str, float]] = {
    "tenant": 0.9, "sharded": 0.9, "crypto": 0.7, "audit": 0.7,
}
"""What each of the project's decorators may cost: its row over the undecorated one."""

Verdict = Literal["met", "not met", "undecided", "not measured", "reference"]


@dataclass(frozen=True, slots=True)
class TargetCheck:
    """One target: what is compared, the measured spread, and the verdict (``note``
    says why a target could not be measured)."""

    name: str
    """What the target measures, e.g. ``conditional-resume-cost``."""
    backend: str
    concurrency: int
    description: str
    kind: Literal["ratio", "overhead"]
    comparison: Literal[">=", "<="]
    threshold: float | None
    """None: a reference figure printed beside the targets, not a target."""
    measured: Spread | None
    note: str | None = None

    def _meets(self, value: float) -> bool:
        assert self.threshold is not None
        return value >= self.threshold if self.comparison == ">=" else value <= self.threshold

    @property
    def verdict(self) -> Verdict:
        if self.threshold is None:
            return "reference"
        if self.measured is None:
            return "not measured"
        interval = self.measured.interval
        low, high = (
            (interval.low, interval.high) if interval is not None
            else (self.measured.median, self.measured.median)
        )
        if self._meets(low) and self._meets(high):
            return "met"
        if not self._meets(low) and not self._meets(high):
            return "not met"
        return "undecided"

    @property
    def met(self) -> bool | None:
        """True or False once decided; None when not measured, undecided or a reference."""
        return {"met": True, "not met": False}.get(self.verdict)


def _overhead(cheap: RowResult | None, dear: RowResult | None) -> Spread | None:
    """Extra time per execution of ``dear`` over ``cheap``, paired per repetition."""
    if cheap is None or dear is None or cheap.ours is None or dear.ours is None:
        return None
    ratios = paired_ratios(cheap.ours.per_second(), dear.ours.per_second())
    return None if ratios is None else ratios.shifted(-1.0)


def _floor_overhead(row: RowResult) -> Spread | None:
    """Extra time per execution of ``row``'s own side over its floor, paired per
    repetition."""
    if row.ours is None or row.raw is None:
        return None
    ratios = paired_ratios(row.raw.per_second(), row.ours.per_second())
    return None if ratios is None else ratios.shifted(-1.0)


def _why_missing(*rows: RowResult | None) -> str:
    for row in rows:
        if row is None:
            return "row not run"
        if row.status != "ok":
            return f"{row.spec.backend} {row.spec.label}: {row.status}"
    return "no repetition measured both"


def evaluate(result: BenchResult) -> tuple[TargetCheck, ...]:
    """Every target the rows of ``result`` allow to check."""
    checks: list[TargetCheck] = []
    for concurrency in result.parameters.concurrency:
        for row in result.rows:
            spec = row.spec
            if spec.kind != "store" or spec.concurrency != concurrency:
                continue
            if spec.backend != "sqlite" or spec.stack:
                continue
            checks.append(
                TargetCheck(
                    "sqlite-vs-raw", "sqlite", concurrency,
                    f"{spec.title}: ours / raw sqlite3", "ratio", ">=", SQLITE_FLOOR_RATIO,
                    row.vs_raw, None if row.vs_raw else _why_missing(row),
                )
            )
        if "postgres" not in result.parameters.backends:
            continue

        def pg(key: str, c: int = concurrency) -> RowResult | None:
            return result.row(f"postgres/{key}@{c}")

        pairs: tuple[tuple[str, str, str, str, float | None], ...] = (
            ("conditional-resume-cost", "park-resume-fence", "park-resume-fence-if",
             "conditional resume (acquire_fence_if) over unconditional (acquire_fence)",
             POSTGRES_OVERHEAD),
            ("fenced-append-cost", "short", "short-fenced-appends",
             "fenced appends (token taken before the clock) over unfenced",
             POSTGRES_OVERHEAD),
            ("fenced-execution-cost", "short", "short-fenced",
             "fenced short execution, its acquire_fence included, over unfenced "
             "(reference)",
             None),
        )
        for name, cheap_key, dear_key, description, threshold in pairs:
            cheap, dear = pg(cheap_key), pg(dear_key)
            if cheap is None or dear is None:
                continue  # not asked for (--scenarios): nothing to report
            measured = _overhead(cheap, dear)
            checks.append(
                TargetCheck(
                    name, "postgres", concurrency, description, "overhead", "<=",
                    threshold, measured,
                    None if measured else _why_missing(cheap, dear),
                )
            )
        short = pg("short")
        if concurrency == PGBENCH_CONCURRENCY and short is not None:
            measured = short.vs_ceiling
            note = None
            if measured is None:
                note = _why_missing(short)
                if short.status == "ok" and short.ceiling is None:
                    note = "pgbench not run (not found, or --no-pgbench)"
            checks.append(
                TargetCheck(
                    "vs-pgbench", "postgres", concurrency,
                    "short executions/s: ours / pgbench (same three transactions)",
                    "ratio", ">=", PGBENCH_RATIO, measured, note,
                )
            )
    checks += _workflow_checks(result)
    checks += _stream_checks(result)
    checks += _stack_checks(result)
    return tuple(checks)


def _stack_checks(result: BenchResult) -> list[TargetCheck]:
    """``decorator-cost``: every row under one decorator with a threshold, over the
    undecorated row of its backend beside it."""
    checks: list[TargetCheck] = []
    for row in result.rows:
        spec = row.spec
        if spec.kind != "store" or len(spec.stack) != 1:
            continue
        (name,) = spec.stack
        threshold = DECORATOR_RATIOS.get(name)
        if threshold is None:
            continue
        measured = row.vs_bare
        note = None
        if measured is None:
            note = _why_missing(row)
            if row.status == "ok":
                note = "the undecorated row was not measured beside it"
        checks.append(
            TargetCheck(
                "decorator-cost", spec.backend, spec.concurrency,
                f"{spec.title} under {name}: decorated / undecorated store",
                "ratio", ">=", threshold, measured, note,
            )
        )
    return checks


def _workflow_checks(result: BenchResult) -> list[TargetCheck]:
    checks: list[TargetCheck] = []
    workflows = [row for row in result.rows if row.spec.kind == "workflow"]
    for row in workflows:
        spec = row.spec
        measured = _floor_overhead(row)
        checks.append(
            TargetCheck(
                "workflow-runtime-cost", spec.backend, spec.concurrency,
                f"{spec.title}: runtime over the store making the same calls",
                "overhead", "<=", RUNTIME_OVERHEAD, measured,
                None if measured else _why_missing(row),
            )
        )
    for row in workflows:
        spec = row.spec
        if spec.backend != "postgres" or spec.concurrency != DBOS_CONCURRENCY:
            continue
        chosen = WORKFLOWS.get(spec.scenario)
        if chosen is None or not chosen.peer:
            continue
        if row.status == "ok" and row.ceiling is None:
            continue  # --no-dbos
        measured = row.vs_ceiling
        note = None
        if measured is None:
            note = _why_missing(row)
            if row.ceiling is not None and row.ceiling.note:
                note = f"dbos {row.ceiling.note}"
            elif row.ceiling is not None and row.ceiling.error:
                note = f"dbos failed: {row.ceiling.error}"
        checks.append(
            TargetCheck(
                "vs-dbos", "postgres", spec.concurrency,
                f"{spec.title}s/s: runtime / DBOS (same workflow, same server)",
                "ratio", ">=", DBOS_RATIO, measured, note,
            )
        )
    return checks


def _stream_checks(result: BenchResult) -> list[TargetCheck]:
    """``vs-eventsourcing``: every stream row over each recorder beside it; a recorder
    skipped (``--no-eventsourcing``) is no target, one not installed says what to install."""
    checks: list[TargetCheck] = []
    for row in result.rows:
        spec = row.spec
        if spec.kind != "stream" or spec.backend not in EVENTSOURCING_BACKENDS:
            continue
        for peer, measured in ((row.raw, row.vs_raw), (row.ceiling, row.vs_ceiling)):
            if row.status == "ok" and peer is None:
                continue  # --no-eventsourcing
            note = None
            if measured is None:
                note = _why_missing(row)
                if peer is not None and peer.note:
                    note = f"{peer.label} {peer.note}"
                elif peer is not None and peer.error:
                    note = f"{peer.label} failed: {peer.error}"
            label = peer.label if peer is not None else "eventsourcing"
            checks.append(
                TargetCheck(
                    "vs-eventsourcing", spec.backend, spec.concurrency,
                    f"{spec.title}: Loom / {label} recorder (same events, same "
                    f"{'server' if spec.backend == 'postgres' else 'disk'})",
                    "ratio", ">=", EVENTSOURCING_RATIO, measured, note,
                )
            )
            if row.status != "ok":
                break  # the row itself is missing: say it once
    return checks
