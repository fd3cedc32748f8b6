"""Online backup with SQLite's backup API, taken while the storage keeps writing; and
subscriptions that see another process's appends."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import loom_sqlite
import pytest
from loom_sqlite import DatabaseOpenError, SeveralDatabasesError, SqliteEventStore
from sqlite_helpers import expect_line, file_bytes, names_in, spawn, url_for

from loom_core import (
    Event,
    EventStore,
    InvalidOptionError,
    NewEvent,
    Storage,
    StoreClosedError,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator


async def test_a_backup_taken_while_writing_opens_as_a_consistent_copy(
    storage: Storage, tmp_path: Path
) -> None:
    events = storage.events
    assert isinstance(events, SqliteEventStore)
    pad = "x" * 1000
    for i in range(300):  # enough pages that the copy takes a while
        await events.append(f"pre-{i}", [NewEvent("A", {"pad": pad})] * 3, expected_sequence=0)
    stop = asyncio.Event()
    started = asyncio.Event()
    written: list[int] = []

    async def keep_writing() -> None:
        while not stop.is_set():
            head = len(written)
            await events.append("live", [NewEvent("STEP_COMPLETED", {"n": head})],
                                expected_sequence=head)
            written.append(head)
            if head == 2:
                started.set()

    writer = asyncio.create_task(keep_writing())
    await started.wait()  # the writer is under way (not a guess at how long that takes)
    before_backup = len(written)
    target = tmp_path / "copy.db"
    await loom_sqlite.backup(storage, target)
    stop.set()
    await writer

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


async def test_a_backup_does_not_wait_for_a_writer_and_leaves_its_write_out(
    storage: Storage, db_path: Path, tmp_path: Path
) -> None:
    # Online, forced rather than hoped for: another connection holds the write lock with
    # an uncommitted write for the whole backup. The backup finishes anyway (WAL readers
    # never wait for writers) and copies the last committed state only.
    await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
    writer = sqlite3.connect(db_path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO loom_logs VALUES ('e', 99)")
        await loom_sqlite.backup(storage, tmp_path / "copy.db")
        writer.execute("COMMIT")
    finally:
        if writer.in_transaction:
            writer.execute("ROLLBACK")
        writer.close()
    assert await storage.events.head("e") == 99
    async with open_storage(url_for(tmp_path / "copy.db")) as copy:
        assert await copy.events.head("e") == 1


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


async def test_a_backup_after_a_change_of_directory_copies_the_open_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative URL names the file in the directory the storage was opened in: a later
    chdir must not make the backup copy (and create) another file of that name."""
    (tmp_path / "opened").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "opened")
    async with open_storage("sqlite:///loom.db") as storage:
        await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
        monkeypatch.chdir(tmp_path / "elsewhere")
        await loom_sqlite.backup(storage, tmp_path / "copy.db")
    assert names_in(tmp_path / "elsewhere") == []
    async with open_storage(url_for(tmp_path / "copy.db")) as copy:
        assert await copy.events.list_executions() == ("e",)


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


class _Shards(EventStoreDecorator):
    """A minimal fan-out (what loom-sharded is, without its routing): every store it
    wraps is named in ``wrapped``; ``inner`` is only the first."""

    def __init__(self, branches: list[EventStore]) -> None:
        super().__init__(branches[0])
        self.branches = tuple(branches)

    @property
    def wrapped(self) -> tuple[EventStore, ...]:
        return self.branches

    decisions = Decisions(
        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
        append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
    )


async def _fanned_out(tmp_path: Path, count: int) -> tuple[Storage, list[Storage]]:
    shards = [await open_storage(url_for(tmp_path / f"shard{i}.db")) for i in range(count)]
    for i, shard in enumerate(shards):
        for n in range(i + 1):  # shard i holds i + 1 logs
            await shard.events.append(f"s{i}-{n}", [NewEvent("A", {"n": n})], expected_sequence=0)

    async def close_all() -> None:
        for shard in shards:
            await shard.close()

    storage = Storage(
        _Shards([s.events for s in shards]), shards[0].timers, shards[0].leases,
        on_close=close_all,
    )
    return storage, shards


async def test_backup_refuses_a_storage_spanning_several_databases(tmp_path: Path) -> None:
    storage, _ = await _fanned_out(tmp_path, 3)
    async with storage:
        with pytest.raises(SeveralDatabasesError, match="backup_all") as caught:
            await loom_sqlite.backup(storage, tmp_path / "copy.db")
    assert caught.value.paths == tuple(str(tmp_path / f"shard{i}.db") for i in range(3))
    assert isinstance(caught.value, InvalidOptionError)
    assert not (tmp_path / "copy.db").exists()


async def test_backup_all_copies_every_database_under_a_fan_out(tmp_path: Path) -> None:
    storage, _ = await _fanned_out(tmp_path, 3)
    out = tmp_path / "backups"
    out.mkdir()
    async with storage:
        written = await loom_sqlite.backup_all(storage, out)
    assert list(written.items()) == [
        (str(tmp_path / f"shard{i}.db"), str(out / f"{i}-shard{i}.db")) for i in range(3)
    ]
    for i in range(3):
        async with open_storage(url_for(out / f"{i}-shard{i}.db")) as copy:
            ids = await copy.events.list_executions()
            assert ids == tuple(f"s{i}-{n}" for n in range(i + 1))
            assert (await copy.events.read(ids[-1]))[0].payload == {"n": i}


async def test_backup_all_of_a_plain_storage_is_one_file(storage: Storage, tmp_path: Path) -> None:
    await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
    out = tmp_path / "backups"
    out.mkdir()
    assert await loom_sqlite.backup_all(storage, out) == {
        str(tmp_path / "loom.db"): str(out / "0-loom.db")
    }


async def test_backup_all_writes_nothing_when_one_shard_is_not_sqlite(tmp_path: Path) -> None:
    sqlite_shard = await open_storage(url_for(tmp_path / "shard0.db"))
    memory_shard = await open_storage("memory://")
    storage = Storage(
        _Shards([sqlite_shard.events, memory_shard.events]), sqlite_shard.timers,
        sqlite_shard.leases,
    )
    out = tmp_path / "backups"
    out.mkdir()
    try:
        for attempt in (loom_sqlite.backup(storage, out / "copy.db"),
                        loom_sqlite.backup_all(storage, out)):
            with pytest.raises(InvalidOptionError, match=r"store 1 \(MemoryEventStore\)"):
                await attempt
    finally:
        await sqlite_shard.close()
        await memory_shard.close()
    assert names_in(out) == []


async def test_backup_all_removes_its_copies_when_a_later_one_fails(tmp_path: Path) -> None:
    storage, shards = await _fanned_out(tmp_path, 3)
    out = tmp_path / "backups"
    out.mkdir()
    await shards[2].close()  # the last database cannot be copied
    async with storage:
        with pytest.raises(StoreClosedError):
            await loom_sqlite.backup_all(storage, out)
    assert names_in(out) == []


async def test_backup_all_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    storage, _ = await _fanned_out(tmp_path, 2)
    out = tmp_path / "backups"
    out.mkdir()
    (out / "1-shard1.db").write_bytes(b"keep me")
    async with storage:
        with pytest.raises(InvalidOptionError, match="exist"):
            await loom_sqlite.backup_all(storage, out)
        with pytest.raises(DatabaseOpenError, match="does not exist"):
            await loom_sqlite.backup_all(storage, tmp_path / "missing")
    assert names_in(out) == ["1-shard1.db"]
    assert file_bytes(out / "1-shard1.db") == b"keep me"
