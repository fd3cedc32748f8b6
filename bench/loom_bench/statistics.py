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

__all__ = [
    "Interval",
    "Sample",
    "Spread",
    "median_interval",
    "paired_ratios",
    "percentile",
    "sample_from",
    "spread",
]


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
class Interval:
    """The median lies within ``low``..``high`` with probability ``confidence``."""

    low: float
    high: float
    confidence: float

    def shifted(self, by: float) -> Interval:
        return Interval(self.low + by, self.high + by, self.confidence)


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of several values, with the smallest and largest, and (when built by
    :func:`spread`) the confidence interval of the median."""

    median: float
    minimum: float
    maximum: float
    count: int
    interval: Interval | None = None

    def shifted(self, by: float) -> Spread:
        """Every figure plus ``by`` (a ratio turned into an overhead: ``by=-1``)."""
        return Spread(
            self.median + by, self.minimum + by, self.maximum + by, self.count,
            None if self.interval is None else self.interval.shifted(by),
        )


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


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The distribution-free confidence interval of the median of ``values``.

    Each value falls below the true median with probability one half, so the number that
    do is binomial(n, 1/2); the interval runs from the k-th smallest to the k-th largest
    value for the largest k whose tails together stay within ``1 - confidence``. With
    fewer than six values no k reaches 95%: the interval is then the whole range, and its
    (lower) confidence is the one reported.
    """
    if not values:
        raise ValueError("an interval of no values")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within 0..1, got {confidence}")
    ordered = sorted(values)
    n = len(ordered)
    below = 0.0  # P(fewer than k values fall below the median), for k = 1, 2, ...
    k = 1
    for candidate in range(1, n // 2 + 1):
        below += math.comb(n, candidate - 1) / 2**n
        if 2 * below > 1.0 - confidence:
            break
        k = candidate
    tail = sum(math.comb(n, j) for j in range(k)) / 2**n
    return Interval(ordered[k - 1], ordered[n - k], max(0.0, 1.0 - 2 * tail))


def spread(values: Sequence[float]) -> Spread:
    """Median, minimum and maximum of ``values`` (the median of an even count is the mean
    of the middle two), with the median's confidence interval."""
    if not values:
        raise ValueError("spread of no values")
    return Spread(
        percentile(values, 0.5), min(values), max(values), len(values),
        median_interval(values),
    )


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
