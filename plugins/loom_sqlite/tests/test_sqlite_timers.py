"""The SQLite timer store (see docs/design.md, "Timers and re-drives") and the migration
of an old-shape timer table."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from loom_sqlite.schema import OLD_TIMERS, SCHEMA_VERSION
from sqlite_helpers import expect_line, finish, send, spawn, url_for

from loom_core import InvalidOptionError, Redrive, Storage, TimerRecord, open_storage

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_schedule_is_idempotent_and_due_is_ordered(storage: Storage) -> None:
    timers = storage.timers
    await timers.schedule(TimerRecord("b", at(2)))
    await timers.schedule(TimerRecord("a", at(2)))
    await timers.schedule(TimerRecord("a", at(1)))
    await timers.schedule(TimerRecord("a", at(1)))
    await timers.schedule(TimerRecord("c", at(9)))
    due = await timers.due(at(5))
    assert [(r.execution_id, r.wake_at) for r in due] == [("a", at(1)), ("a", at(2)), ("b", at(2))]
    assert await timers.due(at(5), limit=1) == (TimerRecord("a", at(1)),)
    assert [r.wake_at for r in await timers.pending("a")] == [at(1), at(2)]


async def test_wake_at_round_trips_exactly_in_utc(storage: Storage) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2030, 6, 1, 12, 0, 0, 654321, tzinfo=plus_two)
    await storage.timers.schedule(TimerRecord("e", local))
    (record,) = await storage.timers.pending("e")
    assert record.wake_at == local
    assert record.wake_at.utcoffset() == timedelta(0)


async def test_a_plain_schedule_never_clears_a_redrive_and_a_later_one_replaces_it(
    storage: Storage,
) -> None:
    timers = storage.timers
    await timers.schedule(TimerRecord("e", at(1)))
    await timers.schedule(TimerRecord("e", at(1), Redrive(0)))
    assert await timers.pending("e") == (TimerRecord("e", at(1), Redrive(0)),)
    await timers.schedule(TimerRecord("e", at(1)))
    assert await timers.pending("e") == (TimerRecord("e", at(1), Redrive(0)),)
    await timers.schedule(TimerRecord("e", at(1), Redrive(3)))
    assert await timers.pending("e") == (TimerRecord("e", at(1), Redrive(3)),)


async def test_due_without_redrive_excludes_them_before_the_limit(storage: Storage) -> None:
    for i in range(5):
        await storage.timers.schedule(TimerRecord(f"r{i}", at(i), Redrive(i)))
    await storage.timers.schedule(TimerRecord("plain", at(10)))
    assert await storage.timers.due(at(20), limit=2, redrive=False) == (
        TimerRecord("plain", at(10)),
    )
    assert len(await storage.timers.due(at(20), limit=2)) == 2


async def test_complete_and_cancel_report_what_they_removed(storage: Storage) -> None:
    timers = storage.timers
    for i in range(3):
        await timers.schedule(TimerRecord("e", at(i)))
    await timers.schedule(TimerRecord("other", at(0)))
    assert await timers.complete("e", at(0)) is True
    assert await timers.complete("e", at(0)) is False
    assert await timers.cancel("e", at(1)) == 1
    assert await timers.cancel("e") == 1
    assert await timers.pending("e") == ()
    assert await timers.pending("other") == (TimerRecord("other", at(0)),)


async def test_naive_times_are_refused(storage: Storage) -> None:
    with pytest.raises(InvalidOptionError, match="timezone-aware"):
        await storage.timers.schedule(TimerRecord("e", datetime(2030, 1, 1)))
    with pytest.raises(InvalidOptionError, match="timezone-aware"):
        await storage.timers.due(datetime(2030, 1, 1))
    assert await storage.timers.pending("e") == ()


def _old_shape_file(path: Path) -> None:
    """A file written before re-drives existed: a timer table without ``redrive``, one row."""
    with sqlite3.connect(path) as raw:
        raw.execute(OLD_TIMERS)
        raw.execute(
            "INSERT INTO loom_timers (execution_id, wake_at) VALUES (?, ?)",
            ("old", 1_893_456_000_000_000),  # 2030-01-01T00:00:00Z in microseconds
        )
    raw.close()


def _columns(path: Path) -> list[str]:
    with sqlite3.connect(path) as raw:
        columns = [row[1] for row in raw.execute("PRAGMA table_info(loom_timers)")]
    raw.close()
    return columns


async def test_an_old_shape_timer_table_is_migrated_on_open(db_path: Path) -> None:
    _old_shape_file(db_path)
    assert "redrive" not in _columns(db_path)
    async with open_storage(url_for(db_path)) as storage:
        assert await storage.timers.pending("old") == (TimerRecord("old", T0),)
        await storage.timers.schedule(TimerRecord("old", T0, Redrive(1)))
        await storage.timers.schedule(TimerRecord("new", at(1), Redrive(0)))
        assert await storage.timers.due(at(5), redrive=False) == ()
        assert len(await storage.timers.due(at(5))) == 2
    assert _columns(db_path) == ["execution_id", "wake_at", "redrive"]
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    raw.close()


@pytest.mark.parametrize("existing", ["old-shape file", "no file yet"])
async def test_two_processes_opening_a_file_together_both_start(
    db_path: Path, existing: str
) -> None:
    if existing == "old-shape file":
        _old_shape_file(db_path)
    url = url_for(db_path)
    # Four at once: switching a rollback-journal file to WAL deadlocks two readers that
    # both want it EXCLUSIVE, and SQLite answers that with an immediate SQLITE_BUSY.
    workers = [spawn("open", url) for _ in range(4)]
    try:
        for worker in workers:  # both are up and blocked on stdin: release them at once
            send(worker, "go")
        for worker in workers:
            expect_line(worker, "opened")
            finish(worker)
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    assert _columns(db_path) == ["execution_id", "wake_at", "redrive"]
    async with open_storage(url) as storage:
        due = await storage.timers.due(at(0))
        old = [r.redrive for r in due if r.execution_id == "old"]
        assert old == ([None] if existing == "old-shape file" else [])
        assert sorted(r.redrive.attempt for r in due if r.redrive is not None) == [0] * 4
