"""Online backup with SQLite's backup API, taken while the storage keeps writing; and
subscriptions that see another process's appends."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import loom_sqlite
import pytest
from loom_sqlite import DatabaseOpenError, SqliteEventStore
from sqlite_helpers import expect_line, file_bytes, names_in, spawn, url_for

from loom_core import Event, InvalidOptionError, NewEvent, Storage, open_storage


async def test_a_backup_taken_while_writing_opens_as_a_consistent_copy(
    storage: Storage, tmp_path: Path
) -> None:
    events = storage.events
    assert isinstance(events, SqliteEventStore)
    pad = "x" * 1000
    for i in range(300):  # enough pages that the copy takes a while
        await events.append(f"pre-{i}", [NewEvent("A", {"pad": pad})] * 3, expected_sequence=0)
    stop = asyncio.Event()
    written: list[int] = []

    async def keep_writing() -> None:
        while not stop.is_set():
            head = len(written)
            await events.append("live", [NewEvent("STEP_COMPLETED", {"n": head})],
                                expected_sequence=head)
            written.append(head)

    writer = asyncio.create_task(keep_writing())
    await asyncio.sleep(0.01)
    before_backup = len(written)
    target = tmp_path / "copy.db"
    await loom_sqlite.backup(storage, target)
    after_backup = len(written)
    stop.set()
    await writer
    assert after_backup > before_backup > 0  # the storage wrote while the copy was taken

    with sqlite3.connect(target) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    raw.close()
    async with open_storage(url_for(target)) as copy:
        copied = await copy.events.read("live")
        assert [e.sequence for e in copied] == list(range(len(copied)))
        assert [e.payload for e in copied] == [{"n": i} for i in range(len(copied))]
        assert await copy.events.head("live") == len(copied)
        assert before_backup <= len(copied) <= len(written)
        assert len(await copy.events.list_executions(limit=1000)) == 301
        # The copy is a working storage of its own.
        await copy.events.append("after", [NewEvent("A")], expected_sequence=0)
    assert await events.head("after") == 0


async def test_backup_refuses_an_existing_target_and_a_missing_directory(
    storage: Storage, tmp_path: Path
) -> None:
    events = storage.events
    assert isinstance(events, SqliteEventStore)
    existing = tmp_path / "existing.db"
    existing.write_bytes(b"keep me")
    with pytest.raises(InvalidOptionError, match="exists"):
        await events.backup(str(existing))
    assert file_bytes(existing) == b"keep me"
    with pytest.raises(DatabaseOpenError, match="does not exist"):
        await events.backup(str(tmp_path / "missing" / "copy.db"))
    assert names_in(tmp_path) == ["existing.db", "loom.db", "loom.db-shm", "loom.db-wal"]


async def test_backup_refuses_a_storage_that_is_not_sqlite(tmp_path: Path) -> None:
    async with open_storage("memory://") as memory:
        with pytest.raises(InvalidOptionError, match="not a SQLite storage"):
            await loom_sqlite.backup(memory, tmp_path / "copy.db")


async def test_subscribe_sees_an_append_made_by_another_process(
    db_path: Path, storage: Storage
) -> None:
    received: list[Event] = []

    async def follow() -> None:
        async for event in storage.events.subscribe("shared"):
            received.append(event)
            return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    other = spawn("append", url_for(db_path), "shared", "0")
    try:
        await asyncio.to_thread(expect_line, other, "appended")
        await asyncio.wait_for(task, timeout=30)
    finally:
        other.kill()
        other.wait()
    assert [(e.kind, e.payload) for e in received] == [("order.shipped", {"from": "other"})]
