"""A SQLite file changed behind the store's back does not change what the store decides.

The store's half of "The audit chain covers what decides behaviour" (docs/design.md): the
log is its rows, with no second record of where it ends that could disagree with them
(the head is one past the last row), so a read, a subscriber and ``acquire_fence_if``
all judge the same events; and ``acquire_fence_if`` derives whether an event answers a
park from its ``kind`` and ``metadata`` (the columns an audit chain covers) when it
scans, never from a flag stored beside them. A file of schema 1, which stored such a
flag, loses it when opened; a file of schema 2, which moved a stored head on every
append, keeps its heads as floors. Each test edits a real file with the ``sqlite3``
module, then goes through the real store.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_helpers import expect_line, finish, parked, send, spawn, url_for

from loom_core import (
    Event,
    FenceAcquired,
    FenceStale,
    JsonObject,
    NewEvent,
    SequenceConflictError,
    Storage,
    open_storage,
)
from loom_core.spi import canonical_json

EVENT_COLUMNS = ["execution_id", "sequence", "kind", "payload", "metadata", "recorded_at"]

# Schema 1 as loom-sqlite 0.1 wrote it: the event table with the derived ``answering``
# flag and its partial index (the other tables are unchanged since).
SCHEMA_1 = (
    "CREATE TABLE loom_executions (execution_id TEXT NOT NULL PRIMARY KEY, "
    "head INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE loom_events (execution_id TEXT NOT NULL, sequence INTEGER NOT NULL, "
    "kind TEXT NOT NULL, payload TEXT NOT NULL, metadata TEXT NOT NULL, "
    "recorded_at INTEGER NOT NULL, answering INTEGER NOT NULL, "
    "PRIMARY KEY (execution_id, sequence)) WITHOUT ROWID",
    "CREATE INDEX loom_events_answering ON loom_events (execution_id, sequence) "
    "WHERE answering = 1",
    "CREATE TABLE loom_fences (execution_id TEXT NOT NULL PRIMARY KEY, "
    "token INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE loom_timers (execution_id TEXT NOT NULL, wake_at INTEGER NOT NULL, "
    "redrive TEXT, PRIMARY KEY (execution_id, wake_at))",
    "CREATE INDEX loom_timers_due ON loom_timers (wake_at, execution_id)",
    "CREATE TABLE loom_leases (lease_key TEXT NOT NULL PRIMARY KEY, holder TEXT NOT NULL, "
    "acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID",
    "PRAGMA user_version = 1",
)
# Schema 2 as loom-sqlite 0.2 wrote it: each log's head in ``loom_executions``, moved by
# every append (the tables not listed are those of schema 1, less the ``answering`` flag).
SCHEMA_2 = (
    "CREATE TABLE loom_executions (execution_id TEXT NOT NULL PRIMARY KEY, "
    "head INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE loom_events (execution_id TEXT NOT NULL, sequence INTEGER NOT NULL, "
    "kind TEXT NOT NULL, payload TEXT NOT NULL, metadata TEXT NOT NULL, "
    "recorded_at INTEGER NOT NULL, PRIMARY KEY (execution_id, sequence)) WITHOUT ROWID",
    *SCHEMA_1[3:-1],
    "PRAGMA user_version = 2",
)
INSERT_1 = (
    "INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, recorded_at, "
    "answering) VALUES (?, ?, ?, 'null', ?, 1893456000000000, ?)"
)


def _columns(path: Path, table: str) -> list[str]:
    raw = sqlite3.connect(path)
    try:
        return [row[1] for row in raw.execute("SELECT * FROM pragma_table_info(?)", (table,))]
    finally:
        raw.close()


def _edit(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    raw = sqlite3.connect(path)
    try:
        with raw:
            raw.execute(sql, params)
    finally:
        raw.close()


def _forge(path: Path, execution_id: str, sequence: int, kind: str) -> None:
    """A row at ``sequence`` with a ``"FORGED"`` payload, copied from event 0 (with a true
    ``answering`` flag where the file still has one)."""
    if "answering" in _columns(path, "loom_events"):
        sql = (
            "INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, "
            "recorded_at, answering) SELECT execution_id, ?, ?, '\"FORGED\"', metadata, "
            "recorded_at, 1 FROM loom_events WHERE execution_id = ? AND sequence = 0"
        )
    else:
        sql = (
            "INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, "
            "recorded_at) SELECT execution_id, ?, ?, '\"FORGED\"', metadata, recorded_at "
            "FROM loom_events WHERE execution_id = ? AND sequence = 0"
        )
    _edit(path, sql, (sequence, kind, execution_id))


def _schema_1_file(path: Path, answer_flag: int) -> None:
    """A schema-1 file: ``p`` fenced at 1, parked at 1 and resumed at 2, with the
    resume's stored ``answering`` flag set to ``answer_flag`` (1 is what 0.1 wrote)."""
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in SCHEMA_1:
            raw.execute(statement)
        fenced = canonical_json({"fence": 1})
        raw.execute("BEGIN")
        for sequence, kind, flag in (
            (0, "EXECUTION_STARTED", 0),
            (1, "EXECUTION_SUSPENDED", 1),
            (2, "EXECUTION_RESUMED", answer_flag),
        ):
            raw.execute(INSERT_1, ("p", sequence, kind, fenced, flag))
        raw.execute("INSERT INTO loom_executions VALUES ('p', 3)")
        raw.execute("INSERT INTO loom_fences VALUES ('p', 1)")
        raw.execute("COMMIT")
    finally:
        raw.close()


async def test_a_row_added_at_the_head_is_in_the_log_for_every_reader(db_path: Path) -> None:
    url = url_for(db_path)
    async with open_storage(url) as storage:
        token = await parked(storage)
    _forge(db_path, "p", 2, "EXECUTION_RESUMED")
    async with open_storage(url) as storage:
        assert await storage.events.head("p") == 3
        read = await storage.events.read("p")
        assert [(e.sequence, e.kind) for e in read] == [
            (0, "EXECUTION_STARTED"), (1, "EXECUTION_SUSPENDED"), (2, "EXECUTION_RESUMED")
        ]
        subscription = storage.events.subscribe("p")
        received: list[Event] = [await anext(subscription) for _ in range(3)]
        await subscription.aclose()  # type: ignore[attr-defined]
        assert received == list(read)
        # The park at 1 is answered in the log a read returns, so the acquire loses.
        assert await storage.events.acquire_fence_if(
            "p", fence=token, park_seq=1
        ) == FenceStale(token)
        with pytest.raises(SequenceConflictError):
            await storage.events.append("p", [NewEvent("STEP_COMPLETED")], expected_sequence=2)


async def test_the_file_stores_no_derived_answering_flag(storage: Storage, db_path: Path) -> None:
    await parked(storage)
    assert _columns(db_path, "loom_events") == EVENT_COLUMNS
    raw = sqlite3.connect(db_path)
    try:
        indexes = [row[0] for row in raw.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'loom_events'"
        )]
    finally:
        raw.close()
    assert "loom_events_answering" not in indexes


@pytest.mark.parametrize(
    ("metadata", "answers"),
    [
        ({"kernel": True}, True),
        ({"kernel": "true"}, False),
        ({"kernel": 1}, False),
        ({"kernel": False}, False),
        ({}, False),
    ],
    ids=["true", "string-true", "one", "false", "absent"],
)
async def test_metadata_written_into_the_file_is_what_the_acquire_judges(
    db_path: Path, metadata: JsonObject, answers: bool
) -> None:
    url = url_for(db_path)
    async with open_storage(url) as storage:
        token = await parked(storage)
        await storage.events.append("p", [NewEvent("future.kind")], expected_sequence=2)
    _edit(
        db_path,
        "UPDATE loom_events SET metadata = ? WHERE execution_id = ? AND sequence = 2",
        (canonical_json(metadata), "p"),
    )
    async with open_storage(url) as storage:
        result = await storage.events.acquire_fence_if("p", fence=token, park_seq=1)
    assert result == (FenceStale(token) if answers else FenceAcquired(token + 1))


async def test_a_kind_written_into_the_file_is_what_the_acquire_judges(db_path: Path) -> None:
    url = url_for(db_path)
    async with open_storage(url) as storage:
        token = await parked(storage)
        await storage.events.append("p", [NewEvent("order.shipped")], expected_sequence=2)
    _edit(
        db_path,
        "UPDATE loom_events SET kind = ? WHERE execution_id = ? AND sequence = 2",
        ("EXECUTION_RESUMED", "p"),
    )
    async with open_storage(url) as storage:
        assert await storage.events.acquire_fence_if("p", fence=token, park_seq=1) == FenceStale(
            token
        )


async def test_a_flipped_answering_flag_in_a_schema_1_file_answers_nothing(db_path: Path) -> None:
    _schema_1_file(db_path, answer_flag=0)  # the resume's flag flipped to "ignorable"
    async with open_storage(url_for(db_path)) as storage:
        assert [e.kind for e in await storage.events.read("p")] == [
            "EXECUTION_STARTED", "EXECUTION_SUSPENDED", "EXECUTION_RESUMED"
        ]
        # The park at 1 was answered at 2: whatever the old flag said, the acquire loses.
        assert await storage.events.acquire_fence_if("p", fence=1, park_seq=1) == FenceStale(1)
    assert _columns(db_path, "loom_events") == EVENT_COLUMNS


async def test_a_schema_1_file_opened_by_four_processes_together_is_migrated_once(
    db_path: Path,
) -> None:
    _schema_1_file(db_path, answer_flag=1)
    url = url_for(db_path)
    workers = [spawn("open", url) for _ in range(4)]
    try:
        for worker in workers:
            send(worker, "go")
        for worker in workers:
            expect_line(worker, "opened")
            finish(worker)
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    assert _columns(db_path, "loom_events") == EVENT_COLUMNS
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert raw.execute("PRAGMA user_version").fetchone() == (3,)
    finally:
        raw.close()
    async with open_storage(url) as storage:
        assert [e.sequence for e in await storage.events.read("p")] == [0, 1, 2]
        assert await storage.events.acquire_fence_if("p", fence=1, park_seq=1) == FenceStale(1)
        assert await storage.events.acquire_fence_if("p", fence=1, park_seq=2) == FenceAcquired(2)


async def test_a_schema_2_file_keeps_every_head_and_goes_on(db_path: Path) -> None:
    # "a": three events; "t": four, of which truncation removed all (only the head says
    # the log went to 4).
    raw = sqlite3.connect(db_path, isolation_level=None)
    try:
        for statement in SCHEMA_2:
            raw.execute(statement)
        raw.execute("BEGIN")
        for sequence in range(3):
            raw.execute(
                "INSERT INTO loom_events VALUES ('a', ?, 'STEP_COMPLETED', 'null', '{}', "
                "1893456000000000)",
                (sequence,),
            )
        raw.execute("INSERT INTO loom_executions VALUES ('a', 3), ('t', 4)")
        raw.execute("COMMIT")
    finally:
        raw.close()
    async with open_storage(url_for(db_path)) as storage:
        events = storage.events
        assert (await events.head("a"), await events.head("t")) == (3, 4)
        assert await events.list_executions() == ("a", "t")
        await events.append("a", [NewEvent("STEP_COMPLETED")], expected_sequence=3)
        await events.append("t", [NewEvent("STEP_COMPLETED")], expected_sequence=4)
        assert [e.sequence for e in await events.read("a")] == [0, 1, 2, 3]
        assert [e.sequence for e in await events.read("t")] == [4]
    raw = sqlite3.connect(db_path)
    try:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_schema")}
        assert "loom_executions" not in tables
        assert _columns(db_path, "loom_logs") == ["execution_id", "floor"]
        assert raw.execute("PRAGMA user_version").fetchone() == (3,)
        # Only a log's first append and its truncations write its floor.
        assert raw.execute("SELECT * FROM loom_logs ORDER BY 1").fetchall() == [
            ("a", 3), ("t", 4)
        ]
    finally:
        raw.close()
