"""Statistics of the harness: percentiles, spreads, samples and paired ratios."""

from __future__ import annotations

import math
import random

import pytest
from loom_bench.statistics import (
    Sample,
    median_interval,
    paired_ratios,
    percentile,
    sample_from,
    spread,
)


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 4.0
    assert percentile(values, 0.5) == 2.5
    assert percentile(values, 0.25) == pytest.approx(1.75)


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_percentile_refuses_a_fraction_outside_zero_to_one(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0], fraction)


def test_percentile_of_nothing_is_refused_not_zero() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)


def test_spread_is_median_min_max_and_count() -> None:
    result = spread([5.0, 1.0, 3.0])
    assert (result.median, result.minimum, result.maximum, result.count) == (3.0, 1.0, 5.0, 3)


def test_sample_from_counts_executions_and_takes_latency_percentiles_in_ms() -> None:
    sample = sample_from([0.001, 0.002, 0.003, 0.004, 0.100], wall_seconds=0.5)
    assert sample.executions == 5
    assert sample.per_second == pytest.approx(10.0)
    assert sample.p50_ms == pytest.approx(3.0)
    assert sample.p99_ms > 90.0


def test_a_run_with_no_execution_has_no_sample() -> None:
    with pytest.raises(ValueError, match="no sample"):
        sample_from([], wall_seconds=1.0)


def test_sample_of_zero_seconds_is_infinitely_fast_not_a_division_error() -> None:
    assert math.isinf(Sample(1, 0.0, 0.0, 0.0).per_second)


def test_paired_ratios_pair_by_repetition_and_skip_unmeasured_ones() -> None:
    ours = [100.0, None, 90.0, 80.0]
    floor = [200.0, 150.0, None, 100.0]
    result = paired_ratios(ours, floor)
    assert result is not None
    assert result.count == 2
    assert (result.minimum, result.maximum) == (0.5, 0.8)
    assert result.median == pytest.approx(0.65)


def test_paired_ratios_with_no_common_repetition_are_none() -> None:
    assert paired_ratios([1.0, None], [None, 2.0]) is None


def test_paired_ratios_refuse_sides_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="one value per repetition"):
        paired_ratios([1.0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("n", "low_rank", "high_rank"),
    # The classic table of order-statistic intervals for the median at 95%.
    [(6, 1, 6), (9, 2, 8), (15, 4, 12), (21, 6, 16), (31, 10, 22)],
)
def test_median_interval_picks_the_textbook_ranks(n: int, low_rank: int, high_rank: int) -> None:
    values = [float(v) for v in range(1, n + 1)]
    random.Random(n).shuffle(values)
    interval = median_interval(values)
    assert (interval.low, interval.high) == (low_rank, high_rank)
    assert interval.confidence >= 0.95


def test_median_interval_of_few_runs_is_the_range_with_its_lower_confidence() -> None:
    interval = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (interval.low, interval.high) == (1.0, 5.0)
    assert interval.confidence == pytest.approx(1 - 2 / 32)


def test_median_interval_covers_the_median_about_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, covered = 2000, 0
    for _ in range(trials):
        interval = median_interval([rng.gauss(0.0, 1.0) for _ in range(15)])
        covered += interval.low <= 0.0 <= interval.high
    assert 0.95 <= covered / trials <= 0.985  # it claims 96.5%


def test_an_overhead_shifts_the_interval_with_the_median() -> None:
    overhead = spread([1.02, 1.05, 1.08, 1.11, 1.04, 1.06]).shifted(-1.0)
    assert overhead.median == pytest.approx(0.055)
    assert overhead.interval is not None
    assert overhead.interval.low == pytest.approx(0.02)
    assert overhead.interval.high == pytest.approx(0.11)
