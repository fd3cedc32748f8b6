"""The Markdown and JSON reports say what was measured, with ratios, statuses and targets."""

from __future__ import annotations

import json

from loom_bench.report_json import SCHEMA, render_json
from loom_bench.report_markdown import (
    format_overhead,
    format_rate,
    format_ratio,
    render_markdown,
)
from loom_bench.results import BenchResult, Parameters, RowResult, RowSpec, SideResult
from loom_bench.statistics import Sample, Spread


def _sample(per_second: float, executions: int = 1000) -> Sample:
    return Sample(executions, executions / per_second, p50_ms=10.0, p99_ms=20.0)


def _side(label: str, *rates: float | None) -> SideResult:
    return SideResult(label, tuple(_sample(r) if r is not None else None for r in rates))


def _result(rows: tuple[RowResult, ...], backends: tuple[str, ...]) -> BenchResult:
    parameters = Parameters(
        backends=backends, concurrency=(64,), executions=1000, runs=2, warmup=100,
        scenarios=("short", "short-fenced"), stacks=(("tenant",),), stack_scenario="short",
        sqlite_synchronous="NORMAL", postgres="server given by --postgres-url",
        command="python3 -m bench --runs 2",
    )
    return BenchResult(
        parameters=parameters,
        machine={"commit": "abcdef0123456789", "nproc": 2, "cpu_model": "Test CPU",
                 "python": "CPython 3.11", "dirty": False,
                 "distributions": {"loom-core": "0.1.0", "orjson": "3.11.9"}},
        settings={"sqlite": {"sqlite_version": "3.40.1", "synchronous": "NORMAL"}},
        rows=rows,
        started_at="2026-01-01T00:00:00+00:00",
        finished_at="2026-01-01T00:01:00+00:00",
    )


def _spec(backend: str, scenario: str, title: str, stack: tuple[str, ...] = ()) -> RowSpec:
    return RowSpec(backend, scenario, title, stack, 64)


def test_formats_print_median_then_range() -> None:
    assert format_rate(Spread(5292.0, 5038.0, 5379.0, 5)) == "5 292 (5 038\u20135 379)"
    assert format_ratio(Spread(0.72, 0.68, 0.75, 5)) == "0.72\u00d7 (0.68\u20130.75)"
    assert format_overhead(Spread(0.081, 0.05, 0.123, 5)) == "+8.1% (+5.0% \u2013 +12.3%)"
    assert format_rate(Spread(10.0, 10.0, 10.0, 1)) == "10"
    assert format_rate(None) == "\u2014"


def test_markdown_has_a_ratio_per_row_and_says_memory_has_no_floor() -> None:
    rows = (
        RowResult(_spec("memory", "short", "unfenced"), "ok", ours=_side("loom", 9000, 11000)),
        RowResult(
            _spec("sqlite", "short", "unfenced"), "ok",
            ours=_side("loom", 800, 900), raw=_side("sqlite3", 1000, 1000),
        ),
        RowResult(
            _spec("sqlite", "short", "unfenced", ("tenant",)), "ok",
            ours=_side("loom", 400, 450), raw=_side("sqlite3", 1000, 1000),
            vs_bare=Spread(0.5, 0.5, 0.5, 2),
        ),
    )
    markdown = render_markdown(_result(rows, ("memory", "sqlite")))
    assert "memory has no raw floor" in markdown
    assert "| unfenced | 850 (800\u2013900) | 10.0 | 1 000 (1 000\u20131 000) | 10.0 | " \
        "0.85\u00d7 (0.80\u20130.90) |" in markdown
    assert "| sqlite | tenant | 425 (400\u2013450) | 10.0 | 0.50\u00d7 (0.50\u20130.50) |" \
        in markdown
    assert "`python3 -m bench --runs 2`" in markdown
    assert "commit abcdef012345" in markdown
    assert "Installed: loom-core 0.1.0, orjson 3.11.9." in markdown
    # The SQLite target (sqlite-vs-raw) is evaluated from the same row.
    assert "unfenced: ours / raw sqlite3 >= 0.70\u00d7 | 0.85\u00d7" in markdown
    assert "| sqlite-vs-raw | sqlite | 64 |" in markdown


def test_a_missing_backend_is_one_line_not_a_crash() -> None:
    rows = tuple(
        RowResult(_spec("postgres", key, key), "not installed", "pip install loom-postgres")
        for key in ("short", "short-fenced")
    )
    markdown = render_markdown(_result(rows, ("postgres",)))
    assert markdown.count("*not installed*: pip install loom-postgres") == 1
    assert "not measured: postgres short: not installed" in markdown


def test_a_target_missed_is_marked_in_bold() -> None:
    rows = (
        RowResult(
            _spec("sqlite", "short", "unfenced"), "ok",
            ours=_side("loom", 500, 600), raw=_side("sqlite3", 1000, 1000),
        ),
    )
    markdown = render_markdown(_result(rows, ("sqlite",)))
    # Two runs: the interval of the median is their whole range, which is below 0.7x.
    assert (
        "| 0.55\u00d7 (0.50\u20130.60) | 0.50\u00d7 \u2013 0.60\u00d7 (50%) | **no** |"
        in markdown
    )


def test_json_keeps_every_sample_the_summaries_and_the_machine() -> None:
    rows = (
        RowResult(
            _spec("sqlite", "short", "unfenced"), "ok",
            ours=_side("loom", 800, None), raw=_side("sqlite3", 1000, 1000),
        ),
        RowResult(_spec("sqlite", "short-fenced", "fenced"), "failed", "boom"),
    )
    data = json.loads(render_json(_result(rows, ("sqlite",))))
    assert data["schema"] == SCHEMA
    assert data["machine"]["nproc"] == 2
    assert data["parameters"]["executions"] == 1000
    first, second = data["rows"]
    assert first["key"] == "sqlite/short@64"
    assert first["ours"]["samples"][1] is None
    assert first["ours"]["samples"][0]["per_second"] == 800
    assert first["ours_over_raw"]["median"] == 0.8
    assert first["ours_over_raw"]["count"] == 1
    assert second["status"] == "failed"
    assert second["note"] == "boom"
    assert second["ours"] is None
    assert [t["met"] for t in data["targets"]] == [True, None]
