"""A file that cannot be used gets a typed error saying what happened; nothing is
half-written.

Faults are real: a lock held by another connection, a directory that does not exist or
cannot be written, a file of garbage or with damaged pages, a page limit standing in for a
full disk, and a trigger that fails one write half-way through a group commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loom_sqlite import (
    DatabaseBusyError,
    DatabaseClosedError,
    DatabaseCorruptError,
    DatabaseOpenError,
    SqliteEventStore,
)
from loom_sqlite.connection import _configure_loop, _switch_to_wal
from loom_sqlite.settings import Settings
from sqlite_helpers import file_bytes, smash_pages, url_for

from loom_core import (
    AppendRequest,
    NewEvent,
    StorageError,
    StorageReadError,
    StorageUnavailableError,
    StorageWriteError,
    open_storage,
)
from loom_core.spi import default_plugins


async def test_a_lock_held_past_busy_timeout_is_busy_and_writes_nothing(db_path: Path) -> None:
    url = url_for(db_path) + "?busy_timeout_ms=100"
    async with open_storage(url) as storage:
        await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
        holder = sqlite3.connect(db_path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            with pytest.raises(DatabaseBusyError, match="busy_timeout_ms=100") as caught:
                await storage.events.append("e", [NewEvent("B")], expected_sequence=1)
            assert isinstance(caught.value, StorageUnavailableError)
            assert "nothing was written" in str(caught.value)
            with pytest.raises(DatabaseBusyError):
                await storage.events.acquire_fence("e")
            # Readers are not blocked by a writer in WAL mode.
            assert await storage.events.head("e") == 1
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        await storage.events.append("e", [NewEvent("B")], expected_sequence=1)
        assert [e.kind for e in await storage.events.read("e")] == ["A", "B"]
        assert await storage.events.acquire_fence("e") == 1


def _rollback_journal_file(path: Path) -> sqlite3.Connection:
    """A file still in rollback-journal mode, and a connection holding it EXCLUSIVE."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    return holder


@contextlib.contextmanager
def _held_until_first_pause(
    path: Path,
) -> Iterator[tuple[sqlite3.Connection, Callable[[float], None], list[float]]]:
    """A connection with no busy handler to a file another connection holds EXCLUSIVE,
    and a ``pause`` that records itself and lets the holder go the first time it runs."""
    holder = _rollback_journal_file(path)
    opener = sqlite3.connect(path, isolation_level=None, timeout=0)
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if holder.in_transaction:
            holder.execute("COMMIT")

    try:
        yield opener, pause, pauses
    finally:
        opener.close()
        if holder.in_transaction:
            holder.execute("COMMIT")
        holder.close()


def test_the_switch_to_wal_waits_where_sqlite_answers_busy_at_once(db_path: Path) -> None:
    # Two connections switching one file to WAL together can each hold what the other
    # needs; SQLite then answers SQLITE_BUSY at once, without its busy handler. A
    # connection with no busy handler (timeout 0) gets that same immediate answer, so it
    # stands in for the deadlocked one here. The holder lets go at the opener's first
    # pause, so the first attempt is refused every time and the retry succeeds, however
    # the machine schedules it: no timer decides it.
    with _held_until_first_pause(db_path) as (opener, pause, pauses):
        settings = Settings(str(db_path), busy_timeout_ms=600_000)
        assert _switch_to_wal(opener, settings, pause) == "wal"
        assert len(pauses) == 1


def test_the_loop_connection_waits_where_another_opener_holds_the_file(db_path: Path) -> None:
    # The loop connection never waits for a lock (its busy timeout is zero), but its first
    # statement reads the schema. Another process opening the file at that moment holds
    # it for a moment (switching it to WAL, recovering the WAL, checkpointing as it
    # closes); the open must wait that out, not fail. The holder lets go at the first
    # pause, so the first attempt is refused every time and the retry succeeds.
    with _held_until_first_pause(db_path) as (loop, pause, pauses):
        _configure_loop(loop, Settings(str(db_path), busy_timeout_ms=600_000), pause)
        assert len(pauses) == 1
        assert loop.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert loop.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)


@pytest.mark.parametrize("configure", [_switch_to_wal, _configure_loop])
def test_a_statement_retried_while_busy_gives_up_after_busy_timeout(
    db_path: Path, configure: Callable[[sqlite3.Connection, Settings], object]
) -> None:
    with _held_until_first_pause(db_path) as (opener, _, _), pytest.raises(
        sqlite3.OperationalError, match="locked"
    ):
        configure(opener, Settings(str(db_path), busy_timeout_ms=50))


async def test_a_missing_directory_is_named_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(DatabaseOpenError, match="does not exist") as caught:
        await open_storage(url_for(missing / "loom.db"))
    assert str(missing) in str(caught.value)
    assert not (tmp_path / "no").exists()


async def test_a_directory_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "loom.db").mkdir()
    with pytest.raises(DatabaseOpenError, match="is a directory"):
        await open_storage(url_for(tmp_path / "loom.db"))


def _as_unprivileged(check: str, path: Path) -> str:
    """Run ``check`` in a forked child that cannot bypass file permissions; its answer.

    As root, permission bits do not apply, so the child drops to ``nobody`` first; the
    fork inherits every module already imported, so it needs no file access to start.
    """
    default_plugins().backend_for("sqlite")  # discover plugins before losing file access
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            answer = asyncio.run(_open_and_write(check, path))
        except BaseException as exc:
            answer = f"crashed: {exc!r}"
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        answer = reader.read().decode()
    os.waitpid(pid, 0)
    return answer


async def _open_and_write(check: str, path: Path) -> str:
    try:
        async with open_storage(url_for(path)) as storage:
            await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
    except StorageError as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"{check}: opened and wrote"


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A directory the unprivileged child can reach (pytest's tmp_path is root-only)."""
    # Under /tmp (world-traversable) when the child will drop to nobody, whatever TMPDIR is.
    parent = "/tmp" if os.geteuid() == 0 else None
    directory = Path(tempfile.mkdtemp(prefix="loom-sqlite-", dir=parent))
    directory.chmod(0o755)
    yield directory
    for child in directory.iterdir():
        child.chmod(0o644)
    shutil.rmtree(directory)


def test_a_read_only_directory_is_named_and_nothing_is_created(reachable_dir: Path) -> None:
    directory = reachable_dir / "ro"
    directory.mkdir()
    directory.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IROTH | stat.S_IXOTH)
    try:
        answer = _as_unprivileged("read-only directory", directory / "loom.db")
    finally:
        directory.chmod(0o755)
    assert answer.startswith("DatabaseOpenError:"), answer
    assert "read-only" in answer
    assert list(directory.iterdir()) == []


async def test_a_read_only_file_is_named_and_left_unchanged(reachable_dir: Path) -> None:
    db_path = reachable_dir / "loom.db"
    async with open_storage(url_for(db_path)) as storage:
        await storage.events.append("seed", [NewEvent("A")], expected_sequence=0)
    db_path.chmod(0o444)
    before = file_bytes(db_path)
    answer = _as_unprivileged("read-only file", db_path)
    assert answer.startswith(("DatabaseOpenError:", "DatabaseReadOnlyError:")), answer
    assert "read-only" in answer
    assert file_bytes(db_path) == before


async def test_a_file_that_is_not_a_database_is_corrupt_and_left_alone(db_path: Path) -> None:
    garbage = b"this is not a SQLite database " * 200
    db_path.write_bytes(garbage)  # noqa: ASYNC240 - setting the scene
    with pytest.raises(DatabaseCorruptError, match="not a database") as caught:
        await open_storage(url_for(db_path))
    assert isinstance(caught.value, StorageReadError)
    assert "restore it from a backup" in str(caught.value)
    assert file_bytes(db_path) == garbage


async def test_damaged_pages_are_reported_as_corrupt_when_read(db_path: Path) -> None:
    async with open_storage(url_for(db_path)) as storage:
        for i in range(40):
            await storage.events.append(
                f"e{i}", [NewEvent("STEP_COMPLETED", {"pad": "x" * 2000})], expected_sequence=0
            )
    smash_pages(db_path, keep_pages=3)  # the header and schema pages survive
    async with open_storage(url_for(db_path)) as storage:
        with pytest.raises(DatabaseCorruptError, match="while reading 'e20'"):
            await storage.events.read("e20")


async def test_a_full_disk_fails_the_write_and_keeps_the_others(db_url: str) -> None:
    async with open_storage(db_url) as storage:
        events = storage.events
        assert isinstance(events, SqliteEventStore)
        # A per-connection limit: set on the thread's connection and on the loop's.
        connection = events._runner.connection
        await connection.call(
            lambda raw: raw.execute("PRAGMA max_page_count = 20").fetchall(),
            doing="test",
            write=False,
        )
        if connection.loop_raw is not None:
            connection.loop_raw.execute("PRAGMA max_page_count = 20").fetchall()
        big = NewEvent("STEP_COMPLETED", {"pad": "x" * 200_000})
        outcomes = await asyncio.gather(
            events.append("big", [big], expected_sequence=0),
            *(events.append(f"small{i}", [NewEvent("A")], expected_sequence=0) for i in range(5)),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], StorageWriteError)
        assert "disk is full" in str(outcomes[0])
        assert await events.head("big") == 0
        assert all(isinstance(o, tuple) for o in outcomes[1:]), outcomes
        assert [await events.head(f"small{i}") for i in range(5)] == [1] * 5


async def test_a_write_failing_half_way_is_undone_alone_in_a_group_commit(
    db_path: Path,
) -> None:
    async with open_storage(url_for(db_path)) as storage:
        events = storage.events
        await events.append("warm", [NewEvent("A")], expected_sequence=0)
        with sqlite3.connect(db_path) as raw:  # fails the *second* part of one append_many
            raw.execute(
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON loom_events "
                "WHEN NEW.kind = 'POISON' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
            )
        raw.close()
        poisoned = events.append_many(
            [
                AppendRequest("half", [NewEvent("A"), NewEvent("B")], 0),
                AppendRequest("other-half", [NewEvent("POISON")], 0),
            ]
        )
        outcomes = await asyncio.gather(
            *(events.append(f"ok{i}", [NewEvent("A")], expected_sequence=0) for i in range(10)),
            poisoned,
            *(events.append(f"ok{i}", [NewEvent("B")], expected_sequence=1) for i in range(10)),
            return_exceptions=True,
        )
        assert isinstance(outcomes[10], StorageWriteError)
        assert "poisoned" in str(outcomes[10])
        assert [o for o in outcomes if isinstance(o, BaseException)] == [outcomes[10]]
        assert await events.head("half") == 0
        assert await events.head("other-half") == 0
        assert {await events.head(f"ok{i}") for i in range(10)} == {2}


async def test_a_closed_storage_refuses_every_call(db_url: str) -> None:
    storage = await open_storage(db_url)
    await storage.close()
    await storage.close()  # closing twice is harmless
    with pytest.raises(DatabaseClosedError, match="closed"):
        await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
    with pytest.raises(DatabaseClosedError):
        await storage.timers.pending("e")
    with pytest.raises(DatabaseClosedError):
        await storage.leases.inspect("k")


@pytest.mark.parametrize(
    ("column", "text"), [("payload", "{not json"), ("metadata", "[1, 2]")]
)
async def test_a_row_edited_outside_loom_is_a_read_error_naming_the_event(
    db_path: Path, column: str, text: str
) -> None:
    url = url_for(db_path)
    async with open_storage(url) as storage:
        await storage.events.append("edited", [NewEvent("k", {"n": 1})], expected_sequence=0)
    with sqlite3.connect(db_path) as raw:
        # A hand edit; the column name comes from the test's own constant list.
        statement = {
            "payload": "UPDATE loom_events SET payload = ? WHERE execution_id = ?",
            "metadata": "UPDATE loom_events SET metadata = ? WHERE execution_id = ?",
        }[column]
        raw.execute(statement, (text, "edited"))
    async with open_storage(url) as storage:
        with pytest.raises(StorageReadError, match=f"event 0 of 'edited' has .*{column}"):
            await storage.events.read("edited")


@pytest.mark.parametrize(
    ("code", "unknown"),
    [
        (sqlite3.SQLITE_IOERR, True),
        (sqlite3.SQLITE_IOERR | (4 << 8), True),  # SQLITE_IOERR_FSYNC
        (sqlite3.SQLITE_NOMEM, True),
        (sqlite3.SQLITE_FULL, False),
        (sqlite3.SQLITE_BUSY, False),
        (sqlite3.SQLITE_READONLY, False),
    ],
    ids=["ioerr", "ioerr-fsync", "nomem", "full", "busy", "readonly"],
)
async def test_a_commit_that_failed_on_the_disk_is_an_unknown_outcome(
    db_url: str, code: int, unknown: bool
) -> None:
    """A COMMIT refused before it wrote (full, busy, read-only) wrote nothing; one that
    failed with an I/O error may have left its frames in the -wal file, so the caller is
    told the outcome is unknown, never that nothing was written."""
    from loom_sqlite.transactions import _commit_failed

    from loom_core import WriteOutcomeUnknownError

    async with open_storage(db_url) as storage:
        assert isinstance(storage.events, SqliteEventStore)
        connection = storage.events._runner._connection
        cause = sqlite3.OperationalError("the commit's error")
        cause.sqlite_errorcode = code
        error = _commit_failed("appending to 'order-42'", cause, connection)
        assert isinstance(error, StorageWriteError)
        assert isinstance(error, WriteOutcomeUnknownError) is unknown, error
        if unknown:
            assert "may be in the -wal file" in str(error)
        else:
            assert "nothing was written" in str(error)
