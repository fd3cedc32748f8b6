"""What one timed run measured (:class:`Sample`) and how runs are summarised.

Throughput is executions per second of wall time for the whole run. Latency is per
execution (first step to last), so at 64 concurrent executions it includes the time an
execution waits for the store behind the others. A row's figure is the median of its runs,
with the minimum and maximum beside it. Ratios (ours over the raw floor, over pgbench,
over the undecorated row) are taken **per repetition**, between runs made next to each
other, and then summarised the same way: pairing is what cancels the drift of a shared,
noisy machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Sample", "Spread", "paired_ratios", "percentile", "sample_from", "spread"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed run: ``executions`` completed in ``seconds`` of wall time."""

    executions: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def per_second(self) -> float:
        return self.executions / self.seconds if self.seconds > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of several values, with the smallest and largest."""

    median: float
    minimum: float
    maximum: float
    count: int


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (0..1) by linear interpolation between closest ranks.

    Refuses an empty sequence or a fraction outside 0..1: a percentile of nothing is not 0.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be within 0..1, got {fraction}")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    weight = position - low
    return ordered[low] * (1.0 - weight) + ordered[high] * weight


def spread(values: Sequence[float]) -> Spread:
    """Median, minimum and maximum of ``values`` (the median of an even count is the mean
    of the middle two)."""
    if not values:
        raise ValueError("spread of no values")
    return Spread(percentile(values, 0.5), min(values), max(values), len(values))


def sample_from(latencies_seconds: Sequence[float], wall_seconds: float) -> Sample:
    """A :class:`Sample` from the per-execution latencies of one run and its wall time."""
    if not latencies_seconds:
        raise ValueError("a run that completed no execution has no sample")
    return Sample(
        executions=len(latencies_seconds),
        seconds=wall_seconds,
        p50_ms=percentile(latencies_seconds, 0.5) * 1000.0,
        p99_ms=percentile(latencies_seconds, 0.99) * 1000.0,
    )


def paired_ratios(
    numerators: Sequence[float | None], denominators: Sequence[float | None]
) -> Spread | None:
    """Summarise ``numerators[i] / denominators[i]`` over the repetitions where both were
    measured; None when no repetition has both."""
    if len(numerators) != len(denominators):
        raise ValueError(
            f"paired ratios need one value per repetition on each side, got "
            f"{len(numerators)} and {len(denominators)}"
        )
    ratios = [
        top / bottom
        for top, bottom in zip(numerators, denominators, strict=True)
        if top is not None and bottom is not None and bottom > 0
    ]
    return spread(ratios) if ratios else None
