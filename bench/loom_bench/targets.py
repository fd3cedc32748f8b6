"""The backend issues' performance targets, checked against a benchmark's rows.

- SQLite (issue 3): every row at least 0.7x of the raw ``sqlite3`` loop doing the same
  writes in the same run.
- PostgreSQL (issue 4): the conditional resume (park/resume under ``acquire_fence_if``)
  costs at most 10% over the unconditional one (under ``acquire_fence``); fenced appends
  at most 10% over unfenced ones (the ``short-fenced-appends`` row: the same three
  appends under a token taken before the clock); and short executions at 64 concurrent
  at least 0.8x of pgbench running the same three transactions against the same server.

Beside them, for reference and without a threshold, the cost of the ``short-fenced`` row
(whose ``acquire_fence`` is a fourth write inside every timed execution, as in the
original's "fenced" column) over ``short``.

A cost "over" another row is ``their throughput / ours - 1`` (the extra time per
execution), paired per repetition. A target is met when the median meets it; min and max
are printed beside it because the machine is noisy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from loom_bench.results import BenchResult, RowResult
from loom_bench.statistics import Spread, paired_ratios

__all__ = ["TargetCheck", "evaluate"]

SQLITE_FLOOR_RATIO: Final = 0.7
POSTGRES_OVERHEAD: Final = 0.10
PGBENCH_RATIO: Final = 0.8
PGBENCH_CONCURRENCY: Final = 64


@dataclass(frozen=True, slots=True)
class TargetCheck:
    """One target: what is compared, the measured spread, and whether the median meets
    it (None when it could not be measured; ``note`` says why)."""

    issue: str
    backend: str
    concurrency: int
    description: str
    kind: Literal["ratio", "overhead"]
    comparison: Literal[">=", "<="]
    threshold: float | None
    """None: a reference figure printed beside the targets, not a target."""
    measured: Spread | None
    note: str | None = None

    @property
    def met(self) -> bool | None:
        if self.measured is None or self.threshold is None:
            return None
        value = self.measured.median
        return value >= self.threshold if self.comparison == ">=" else value <= self.threshold


def _overhead(cheap: RowResult | None, dear: RowResult | None) -> Spread | None:
    """Extra time per execution of ``dear`` over ``cheap``, paired per repetition."""
    if cheap is None or dear is None or cheap.ours is None or dear.ours is None:
        return None
    ratios = paired_ratios(cheap.ours.per_second(), dear.ours.per_second())
    if ratios is None:
        return None
    return Spread(ratios.median - 1, ratios.minimum - 1, ratios.maximum - 1, ratios.count)


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
            if spec.backend != "sqlite" or spec.stack or spec.concurrency != concurrency:
                continue
            checks.append(
                TargetCheck(
                    "issue 3", "sqlite", concurrency,
                    f"{spec.title}: ours / raw sqlite3", "ratio", ">=", SQLITE_FLOOR_RATIO,
                    row.vs_raw, None if row.vs_raw else _why_missing(row),
                )
            )
        if "postgres" not in result.parameters.backends:
            continue

        def pg(key: str, c: int = concurrency) -> RowResult | None:
            return result.row(f"postgres/{key}@{c}")

        pairs: tuple[tuple[str, str, str, float | None], ...] = (
            ("park-resume-fence", "park-resume-fence-if",
             "conditional resume (acquire_fence_if) over unconditional (acquire_fence)",
             POSTGRES_OVERHEAD),
            ("short", "short-fenced-appends",
             "fenced appends (token taken before the clock) over unfenced",
             POSTGRES_OVERHEAD),
            ("short", "short-fenced",
             "fenced short execution, its acquire_fence included, over unfenced "
             "(reference)",
             None),
        )
        for cheap_key, dear_key, description, threshold in pairs:
            cheap, dear = pg(cheap_key), pg(dear_key)
            if cheap is None or dear is None:
                continue  # not asked for (--scenarios): nothing to report
            measured = _overhead(cheap, dear)
            checks.append(
                TargetCheck(
                    "issue 4", "postgres", concurrency, description, "overhead", "<=",
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
                    "issue 4", "postgres", concurrency,
                    "short executions/s: ours / pgbench (same three transactions)",
                    "ratio", ">=", PGBENCH_RATIO, measured, note,
                )
            )
    return tuple(checks)
