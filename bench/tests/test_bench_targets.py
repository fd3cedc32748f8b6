"""The targets are computed from paired repetitions of the right rows."""

from __future__ import annotations

import pytest
from loom_bench.results import BenchResult, Parameters, RowResult, RowSpec, SideResult
from loom_bench.statistics import Sample, Spread, paired_ratios
from loom_bench.targets import TargetCheck, evaluate


def _side(label: str, *rates: float) -> SideResult:
    return SideResult(label, tuple(Sample(1000, 1000 / r, 1.0, 2.0) for r in rates))


def _row(key: str, ours: SideResult, ceiling: SideResult | None = None) -> RowResult:
    return RowResult(RowSpec("postgres", key, key, (), 64), "ok", ours=ours, ceiling=ceiling)


def _evaluate(*rows: RowResult) -> tuple[TargetCheck, ...]:
    parameters = Parameters(
        backends=("postgres",), concurrency=(64,), executions=1000, runs=2, warmup=0,
        scenarios=(), stacks=(), stack_scenario="short", sqlite_synchronous="NORMAL",
        postgres="given", command="",
    )
    return evaluate(BenchResult(parameters, {}, {}, rows, "", ""))


def _checks(*rows: RowResult) -> dict[str, TargetCheck]:
    """The targets (reference figures left out) by the first word of their description."""
    return {
        check.description.split(" ")[0]: check
        for check in _evaluate(*rows)
        if check.threshold is not None
    }


def test_the_conditional_resume_cost_is_paired_per_repetition() -> None:
    checks = _checks(
        _row("park-resume-fence", _side("loom", 1150, 2000)),
        _row("park-resume-fence-if", _side("loom", 1000, 1600)),
    )
    conditional = checks["conditional"]
    assert conditional.measured is not None
    # Per repetition: 1150/1000 - 1 = 15%, 2000/1600 - 1 = 25%; the median is 20%.
    assert conditional.measured.median == pytest.approx(0.20)
    assert conditional.measured.minimum == pytest.approx(0.15)
    assert conditional.verdict == "not met"
    assert conditional.met is False


def test_fenced_appends_within_ten_percent_of_unfenced_is_met() -> None:
    rows = (
        _row("short", _side("loom", 1050, 1000), _side("pgbench", 1200, 1250)),
        _row("short-fenced-appends", _side("loom", 1000, 1000)),
        _row("short-fenced", _side("loom", 700, 800)),
    )
    checks = _checks(*rows)
    assert checks["fenced"].description.startswith("fenced appends")
    assert checks["fenced"].met is True
    pgbench = checks["short"]
    assert pgbench.measured is not None
    assert pgbench.measured.median == pytest.approx((1050 / 1200 + 1000 / 1250) / 2)
    assert pgbench.met is True
    # The row with the acquire inside the clock is a reference figure, never a verdict.
    (reference,) = [c for c in _evaluate(*rows) if c.threshold is None]
    assert reference.measured is not None
    assert reference.measured.median == pytest.approx((1050 / 700 + 1000 / 800) / 2 - 1)
    assert reference.met is None


def test_the_pgbench_target_without_pgbench_says_why() -> None:
    checks = _checks(_row("short", _side("loom", 1000)))
    assert checks["short"].met is None
    assert checks["short"].note == "pgbench not run (not found, or --no-pgbench)"
    assert "fenced" not in checks  # the fenced row was not asked for: no target row


def test_a_median_under_the_threshold_within_the_noise_is_undecided() -> None:
    # The median is +7%, but one repetition paid +30%, and six runs cannot rule out
    # that the true cost is above 10%.
    checks = _checks(
        _row("short", _side("loom", 1050, 1120, 1300, 1040, 1060, 1080)),
        _row("short-fenced-appends", _side("loom", 1000, 1000, 1000, 1000, 1000, 1000)),
    )
    fenced = checks["fenced"]
    assert fenced.measured is not None
    assert fenced.measured.median == pytest.approx(0.07)
    assert fenced.verdict == "undecided"
    assert fenced.met is None


def test_a_target_is_met_only_when_its_whole_interval_meets_it() -> None:
    rates = (1010, 1030, 1050, 1020, 1060, 1040, 1000, 1070, 1020, 1030)
    checks = _checks(
        _row("short", _side("loom", *rates)),
        _row("short-fenced-appends", _side("loom", *([1000] * len(rates)))),
    )
    fenced = checks["fenced"]
    assert fenced.measured is not None
    assert fenced.measured.interval is not None
    assert fenced.measured.interval.high <= 0.10
    assert fenced.verdict == "met"


def _workflow(key: str, backend: str, runtime: SideResult, store: SideResult,
              dbos: SideResult | None = None) -> RowResult:
    return RowResult(
        RowSpec(backend, key, key, (), 64, "workflow"), "ok",
        ours=runtime, raw=store, ceiling=dbos,
    )


def test_the_runtime_cost_is_the_store_twin_over_the_runtime_per_repetition() -> None:
    checks = [
        c for c in _evaluate(
            _workflow("workflow-one-step", "postgres", _side("runtime", 900, 1000),
                      _side("store", 1000, 1200), _side("dbos", 40, 45)),
            _workflow("workflow-sleep", "postgres", _side("runtime", 500, 500),
                      _side("store", 700, 720)),
        )
        if c.name == "workflow-runtime-cost"
    ]
    one, sleep = checks
    assert one.measured is not None
    # 1000/900 - 1 = 11.1%, 1200/1000 - 1 = 20%: both within 25%.
    assert one.measured.median == pytest.approx((1000 / 900 + 1200 / 1000) / 2 - 1)
    assert one.verdict == "met"
    assert sleep.verdict == "not met"


def test_vs_dbos_is_judged_on_the_one_step_row_only() -> None:
    checks = {
        (c.name, c.description.split(":")[0]): c
        for c in _evaluate(
            _workflow("workflow-one-step", "postgres", _side("runtime", 900, 1000),
                      _side("store", 1000, 1100), _side("dbos", 40, 45)),
            _workflow("workflow-three-steps", "postgres", _side("runtime", 500, 500),
                      _side("store", 520, 540)),
        )
    }
    vs_dbos = checks["vs-dbos", "workflow-one-steps/s"]
    assert vs_dbos.measured is not None
    assert vs_dbos.measured.median == pytest.approx((900 / 40 + 1000 / 45) / 2)
    assert vs_dbos.met is True
    assert [name for name, _ in checks].count("vs-dbos") == 1


def test_vs_dbos_without_dbos_says_what_to_install() -> None:
    absent = SideResult("dbos", (None, None), note="not installed: pip install 'loom-bench[dbos]'")
    (check,) = [
        c for c in _evaluate(
            _workflow("workflow-one-step", "postgres", _side("runtime", 900, 1000),
                      _side("store", 1000, 1100), absent),
        )
        if c.name == "vs-dbos"
    ]
    assert check.verdict == "not measured"
    assert check.note == "dbos not installed: pip install 'loom-bench[dbos]'"


def _stream(key: str, backend: str, concurrency: int, loom: SideResult,
            aggregate: SideResult | None, application: SideResult | None) -> RowResult:
    return RowResult(
        RowSpec(backend, key, key, (), concurrency, "stream"), "ok",
        ours=loom, raw=aggregate, ceiling=application,
    )


def test_vs_eventsourcing_is_judged_per_recorder_at_every_concurrency_on_both_backends() -> None:
    rows = [
        _stream(key, backend, concurrency, _side("loom", 1000, 1200),
                _side("eventsourcing aggregate", 800, 1000),
                _side("eventsourcing application", 1100, 1300))
        for backend in ("sqlite", "postgres")
        for concurrency in (1, 8, 64)
        for key in ("stream-new", "stream-append")
    ]
    rows.append(_stream("stream-new", "memory", 64, _side("loom", 5000), None, None))
    checks = [c for c in _evaluate(*rows) if c.name == "vs-eventsourcing"]
    assert len(checks) == 2 * 3 * 2 * 2  # backends x concurrencies x rows x recorders
    assert {(c.backend, c.concurrency) for c in checks} == {
        (b, c) for b in ("sqlite", "postgres") for c in (1, 8, 64)
    }
    aggregate = [c for c in checks if "aggregate" in c.description]
    application = [c for c in checks if "application" in c.description]
    for check in aggregate:
        assert check.measured is not None
        # Per repetition: 1000/800 = 1.25, 1200/1000 = 1.2; the median is their mean.
        assert check.measured.median == pytest.approx((1.25 + 1.2) / 2)
        assert check.measured.minimum == pytest.approx(1.2)
        assert check.threshold == 1.0
        assert check.verdict == "met"
    for check in application:
        assert check.measured is not None
        assert check.measured.median == pytest.approx((1000 / 1100 + 1200 / 1300) / 2)
        # A target missed is a verdict in the report, not an error.
        assert check.verdict == "not met"
        assert check.met is False


def test_vs_eventsourcing_without_it_says_what_to_install_and_without_the_flag_is_absent(
) -> None:
    note = "not installed: pip install 'loom-bench[eventsourcing]'"
    absent = SideResult("eventsourcing aggregate", (None, None), note=note)
    missing = [
        c for c in _evaluate(
            _stream("stream-new", "sqlite", 8, _side("loom", 900, 1000), absent, None),
        )
        if c.name == "vs-eventsourcing"
    ]
    assert [(c.verdict, c.note) for c in missing] == [
        ("not measured", f"eventsourcing aggregate {note}")
    ]
    skipped = _evaluate(
        _stream("stream-new", "sqlite", 8, _side("loom", 900, 1000), None, None)
    )
    assert [c for c in skipped if c.name == "vs-eventsourcing"] == []


def _stacked(backend: str, stack: tuple[str, ...], vs_bare: Spread | None) -> RowResult:
    return RowResult(
        RowSpec(backend, "short", "short execution", stack, 64), "ok",
        ours=_side("loom", 700, 800), vs_bare=vs_bare,
    )


def test_each_decorator_is_held_to_its_own_ratio_over_the_undecorated_row() -> None:
    over = paired_ratios(
        _side("loom", 820, 950).per_second(), _side("loom", 1000, 1000).per_second()
    )
    assert over is not None  # 0.82 and 0.95: above 0.7, not above 0.9
    checks = {
        (c.backend, c.description.split(" under ")[1].split(":")[0]): c
        for c in _evaluate(
            _stacked("postgres", ("tenant",), over),
            _stacked("sqlite", ("crypto",), over),
            _stacked("memory", ("audit",), None),
            _stacked("postgres", ("crypto", "audit"), over),
            _stacked("postgres", ("someone-elses",), over),
        )
        if c.name == "decorator-cost"
    }
    assert set(checks) == {("postgres", "tenant"), ("sqlite", "crypto"), ("memory", "audit")}
    assert checks["postgres", "tenant"].threshold == 0.9
    assert checks["postgres", "tenant"].verdict == "undecided"
    assert checks["sqlite", "crypto"].threshold == 0.7
    assert checks["sqlite", "crypto"].verdict == "met"
    assert checks["memory", "audit"].verdict == "not measured"
    assert checks["memory", "audit"].note == "the undecorated row was not measured beside it"
