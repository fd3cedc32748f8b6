"""The SQLite raw floor writes the same rows as our store, with the same settings."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from loom_bench.drive import RunPlan
from loom_bench.raw_sqlite import RawSqliteFloor, measure_raw_sqlite
from loom_bench.scenarios import SCENARIOS, ScenarioError, expected_log


def _log(path: Path, execution_id: str) -> list[tuple[str, int]]:
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT kind, metadata FROM events WHERE execution_id = ? ORDER BY sequence",
            (execution_id,),
        ).fetchall()
    return [(kind, json.loads(metadata).get("fence", 0)) for kind, metadata in rows]


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_one_raw_execution_writes_the_same_events_as_ours(key: str, tmp_path: Path) -> None:
    path = tmp_path / "raw.db"
    floor = RawSqliteFloor(path)
    scenario = SCENARIOS[key]
    try:
        if scenario.setup_only is not None:
            floor.run_execution("e-1", scenario.setup_only)
        floor.run_execution("e-1", scenario)
    finally:
        floor.close()
    assert _log(path, "e-1") == list(expected_log(scenario))
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT floor FROM logs").fetchall() == []  # as the store's
        assert db.execute("SELECT max(sequence) + 1 FROM events").fetchall() == [
            (scenario.appends,)
        ]


def test_a_raw_append_is_refused_like_ours_and_writes_nothing(tmp_path: Path) -> None:
    """The floor makes the store's checks: the head must be the expected sequence and a
    fenced append's token the current one (the check costs what the store's costs)."""
    path = tmp_path / "raw.db"
    floor = RawSqliteFloor(path)
    try:
        floor.run_execution("e-1", SCENARIOS["short"])
        with pytest.raises(ScenarioError, match="refused"):
            floor.run_execution("e-1", SCENARIOS["short"])  # the head is 3, not 0
        with pytest.raises(ScenarioError, match="refused"):
            floor.run_execution("e-2", SCENARIOS["short-fenced-appends"])  # no token held
    finally:
        floor.close()
    assert _log(path, "e-1") == list(expected_log(SCENARIOS["short"]))
    assert _log(path, "e-2") == []


def test_fenced_variants_leave_the_fence_row_at_the_acquired_token(tmp_path: Path) -> None:
    path = tmp_path / "raw.db"
    floor = RawSqliteFloor(path)
    try:
        floor.run_execution("a", SCENARIOS["short-fenced"])
        floor.run_execution("b", SCENARIOS["park-resume-fence-if"])
        floor.run_execution("c", SCENARIOS["short"])
    finally:
        floor.close()
    with sqlite3.connect(path) as db:
        tokens = dict(db.execute("SELECT execution_id, token FROM fences").fetchall())
    assert tokens == {"a": 1, "b": 1}


@pytest.mark.parametrize(("setting", "pragma_value"), [("NORMAL", 1), ("FULL", 2)])
def test_the_floor_uses_wal_and_the_requested_synchronous(
    setting: str, pragma_value: int, tmp_path: Path
) -> None:
    floor = RawSqliteFloor(tmp_path / "raw.db", synchronous=setting)  # type: ignore[arg-type]
    try:
        db = floor._db
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == pragma_value
    finally:
        floor.close()


def test_an_unknown_synchronous_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="NORMAL or FULL"):
        RawSqliteFloor(tmp_path / "raw.db", synchronous="OFF")  # type: ignore[arg-type]


def test_a_stale_raw_conditional_acquire_raises_and_leaves_the_token(tmp_path: Path) -> None:
    path = tmp_path / "raw.db"
    floor = RawSqliteFloor(path)
    try:
        floor.run_execution("e-1", SCENARIOS["park-resume-fence"])
        # The park is answered (resumed, completed): a conditional acquire must be stale.
        with pytest.raises(ScenarioError, match="stale"):
            floor._acquire_if("e-1", expected=1, park_sequence=1)
    finally:
        floor.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT token FROM fences").fetchall() == [(1,)]


async def test_a_timed_raw_run_writes_warmup_and_timed_executions(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    ticks: list[int] = []
    plan = RunPlan(executions=5, concurrency=64, warmup=2, prefix="p")
    sample = await measure_raw_sqlite(
        path, "NORMAL", SCENARIOS["park-resume"], plan, lambda: ticks.append(1)
    )
    assert sample.executions == 5
    assert len(ticks) == 5
    with sqlite3.connect(path) as db:
        count = db.execute("SELECT count(*) FROM events").fetchone()[0]
        ids = {row[0] for row in db.execute("SELECT execution_id FROM events")}
    assert count == (5 + 2) * 4
    assert ids == {"p-0", "p-1", "p-2", "p-3", "p-4", "p-w0", "p-w1"}


async def test_a_setup_takes_every_token_before_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "setup.db"
    ticks: list[int] = []
    plan = RunPlan(executions=4, concurrency=64, warmup=1, prefix="f")
    sample = await measure_raw_sqlite(
        path, "NORMAL", SCENARIOS["short-fenced-appends"], plan, lambda: ticks.append(1)
    )
    assert sample.executions == 4
    assert len(ticks) == 4
    with sqlite3.connect(path) as db:
        tokens = dict(db.execute("SELECT execution_id, token FROM fences").fetchall())
    assert tokens == {"f-0": 1, "f-1": 1, "f-2": 1, "f-3": 1, "f-w0": 1}
    assert _log(path, "f-2") == list(expected_log(SCENARIOS["short-fenced-appends"]))
