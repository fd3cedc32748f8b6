"""pgbench scripts carry no data (every value is a -D variable) and its output is parsed."""

from __future__ import annotations

import json

import pytest
from loom_bench.pgbench import PgbenchError, parse_latencies, parse_summary, script_for
from loom_bench.scenarios import SCENARIOS, Append

REPORT = """\
transaction type: /tmp/short.sql
scaling factor: 1
query mode: prepared
number of clients: 64
number of threads: 2
maximum number of tries: 1
number of transactions per client: 47
number of transactions actually processed: 3008/3008
number of failed transactions: 0 (0.000%)
latency average = 11.214 ms
initial connection time = 93.187 ms
tps = 5707.132640 (without initial connection time)
"""


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_the_script_holds_no_value_only_variables(key: str) -> None:
    chosen = SCENARIOS[key]
    script, variables = script_for(chosen)
    for step in chosen.steps:
        if isinstance(step, Append):
            payload = json.dumps(step.event.payload, separators=(",", ":"))
            assert payload in variables.values()
            assert payload not in script
            assert step.event.kind not in script
    # One autocommit statement per append, so one transaction per append.
    statements = [line for line in script.splitlines() if "bench_raw_events (" in line]
    assert len(statements) == chosen.appends


def test_the_conditional_acquire_is_one_transaction_locking_the_fence_row() -> None:
    script, variables = script_for(SCENARIOS["park-resume-fence-if"])
    lines = script.splitlines()
    begin, end = lines.index("BEGIN;"), lines.index("END;")
    inside = "\n".join(lines[begin:end])
    assert "FOR UPDATE" in inside
    assert "NOT EXISTS" in inside
    assert variables["park_seq"] == "1"


def test_the_summary_gives_tps_and_processed_count() -> None:
    tps, processed = parse_summary(REPORT)
    assert tps == pytest.approx(5707.13264)
    assert processed == 3008


def test_a_report_with_failed_transactions_is_refused() -> None:
    failed = REPORT.replace("failed transactions: 0 (0.000%)", "failed transactions: 3 (0.1%)")
    with pytest.raises(PgbenchError, match="3 failed"):
        parse_summary(failed)


def test_a_report_without_figures_is_refused() -> None:
    with pytest.raises(PgbenchError, match="no tps"):
        parse_summary("pgbench: error: connection refused\n")


def test_latencies_are_read_from_the_transaction_log_in_seconds() -> None:
    lines = ["0 0 1500 0 1700000000 123", "1 0 2500 0 1700000000 456", "garbage"]
    assert parse_latencies(lines) == [0.0015, 0.0025]


def test_the_fenced_appends_script_presents_the_setup_token_and_acquires_nothing() -> None:
    script, variables = script_for(SCENARIOS["short-fenced-appends"])
    assert variables["token"] == "1"
    assert "bench_raw_fences (execution_id, token)" not in script  # no acquire, no park
    fenced = [line for line in script.splitlines() if "<= :token::bigint" in line]
    assert len(fenced) == 3
