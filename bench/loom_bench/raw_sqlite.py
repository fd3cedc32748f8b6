"""The SQLite raw floor: the same writes through the stdlib ``sqlite3`` module, no Loom code.

A plain loop on one connection, in one thread, with the same WAL and ``synchronous``
settings as the store under test, writing the same rows in the same transactions as the
store must (SQLite has one writer, so a loop is the fastest honest way to drive it):

- an append is one ``BEGIN IMMEDIATE`` transaction: read the execution's head and token
  (one statement; the head is one past the last event, never below the log's floor),
  refuse unless the head is the expected sequence (and, when fenced, the token is the one
  presented), insert the event, ``COMMIT``. The head read includes the log's floor (the
  head a truncation keeps when it removes every event), which no append writes;
- ``acquire_fence`` is one upsert that bumps the token (one statement is its own
  transaction);
- ``acquire_fence_if`` checks the token and scans for an answering event past the park in
  one ``BEGIN IMMEDIATE`` before the bump.

The tables have the store's shape: ``WITHOUT ROWID``, keyed by execution id (and sequence),
times as INTEGER microseconds.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Final, Literal

from loom_bench.drive import RunPlan, Tick, drive_sequentially
from loom_bench.scenarios import PARK, AcquireFence, Append, Scenario, ScenarioError
from loom_bench.statistics import Sample
from loom_core.spi import ANSWERING_KINDS, KERNEL_KINDS

__all__ = ["SCHEMA", "RawSqliteFloor", "Synchronous", "measure_raw_sqlite"]

Synchronous = Literal["NORMAL", "FULL"]

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS logs (
        execution_id TEXT NOT NULL PRIMARY KEY,
        floor INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS events (
        execution_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        metadata TEXT NOT NULL,
        recorded_at INTEGER NOT NULL,
        PRIMARY KEY (execution_id, sequence)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS fences (
        execution_id TEXT NOT NULL PRIMARY KEY,
        token INTEGER NOT NULL
    ) WITHOUT ROWID""",
)
PRAGMAS: Final[dict[Synchronous, tuple[str, ...]]] = {
    "NORMAL": ("PRAGMA journal_mode = WAL", "PRAGMA synchronous = NORMAL"),
    "FULL": ("PRAGMA journal_mode = WAL", "PRAGMA synchronous = FULL"),
}
BUSY_TIMEOUT: Final = "PRAGMA busy_timeout = 5000"
STATE: Final = (
    "SELECT max(coalesce((SELECT floor FROM logs WHERE execution_id = :id), 0), "
    "coalesce((SELECT max(sequence) + 1 FROM events WHERE execution_id = :id), 0)), "
    "(SELECT token FROM fences WHERE execution_id = :id)"
)
INSERT: Final = (
    "INSERT INTO events (execution_id, sequence, kind, payload, metadata, recorded_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
ACQUIRE: Final = (
    "INSERT INTO fences (execution_id, token) VALUES (?, 1) "
    "ON CONFLICT (execution_id) DO UPDATE SET token = token + 1 RETURNING token"
)
CURRENT_TOKEN: Final = "SELECT token FROM fences WHERE execution_id = ?"
# The answered-park scan: an answering kernel kind, or an unknown kind stamped kernel: true
# (see docs/design.md, "Answering and ignorable events").
ANSWERED_AFTER: Final = (
    "SELECT EXISTS (SELECT 1 FROM events WHERE execution_id = ? AND sequence > ? AND ("
    "kind IN (SELECT value FROM json_each(?)) OR ("
    "kind NOT IN (SELECT value FROM json_each(?)) "
    "AND json_type(metadata, '$.kernel') = 'true')))"
)
_ANSWERING_JSON: Final = json.dumps(sorted(ANSWERING_KINDS))
_KERNEL_JSON: Final = json.dumps(sorted(KERNEL_KINDS))


class RawSqliteFloor:
    """One ``sqlite3`` connection writing a scenario's rows into its own file."""

    def __init__(self, path: Path, *, synchronous: Synchronous = "NORMAL") -> None:
        if synchronous not in PRAGMAS:
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.path = path
        # Autocommit: every statement is its own transaction unless we BEGIN one.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in (*PRAGMAS[synchronous], BUSY_TIMEOUT):
            self._db.execute(pragma)
        for statement in SCHEMA:
            self._db.execute(statement)

    def close(self) -> None:
        self._db.close()

    def run_execution(self, execution_id: str, scenario: Scenario) -> None:
        """Write one execution of ``scenario``; raises ScenarioError if a guard refuses."""
        db = self._db
        sequence = 0
        token = scenario.held_token
        park_token, park_sequence = 0, -1
        for step in scenario.steps:
            if isinstance(step, Append):
                fenced = step.fenced and token is not None
                row = (
                    execution_id,
                    sequence,
                    step.event.kind,
                    json.dumps(step.event.payload, separators=(",", ":")),
                    json.dumps({"fence": token}) if fenced else "{}",
                    time.time_ns() // 1000,
                )
                self._append(row, token if fenced else None)
                if step.event.kind == PARK.kind:
                    park_token = token if fenced and token is not None else 0
                    park_sequence = sequence
                sequence += 1
            elif isinstance(step, AcquireFence):
                token = db.execute(ACQUIRE, (execution_id,)).fetchone()[0]
            else:
                token = self._acquire_if(execution_id, park_token, park_sequence)

    def _append(self, row: tuple[str, int, str, str, str, int], fence: int | None) -> None:
        db = self._db
        execution_id, sequence = row[0], row[1]
        db.execute("BEGIN IMMEDIATE")
        try:
            head, current = db.execute(STATE, {"id": execution_id}).fetchone()
            if head != sequence or (fence is not None and (current or 0) != fence):
                raise ScenarioError(f"raw append to {execution_id!r} at {sequence} refused")
            db.execute(INSERT, row)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _acquire_if(self, execution_id: str, expected: int, park_sequence: int) -> int:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            found = db.execute(CURRENT_TOKEN, (execution_id,)).fetchone()
            current = found[0] if found is not None else 0
            answered = db.execute(
                ANSWERED_AFTER, (execution_id, park_sequence, _ANSWERING_JSON, _KERNEL_JSON)
            ).fetchone()[0]
            if current != expected or answered:
                raise ScenarioError(f"raw acquire_fence_if of {execution_id!r} was stale")
            token: int = db.execute(ACQUIRE, (execution_id,)).fetchone()[0]
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return token


async def measure_raw_sqlite(
    path: Path, synchronous: Synchronous, scenario: Scenario, plan: RunPlan, tick: Tick
) -> Sample:
    """One timed raw run in a fresh file, in a worker thread (the loop keeps drawing the
    progress line). ``plan.concurrency`` does not apply: the floor is one writer loop."""

    setup = scenario.setup_only

    def run() -> Sample:
        floor = RawSqliteFloor(path, synchronous=synchronous)
        try:
            for index in range(plan.warmup):
                if setup is not None:
                    floor.run_execution(plan.warmup_id(index), setup)
                floor.run_execution(plan.warmup_id(index), scenario)
            if setup is not None:
                for index in range(plan.executions):
                    floor.run_execution(plan.execution_id(index), setup)
            return drive_sequentially(
                plan.executions,
                lambda index: floor.run_execution(plan.execution_id(index), scenario),
                tick,
            )
        finally:
            floor.close()

    return await asyncio.to_thread(run)
