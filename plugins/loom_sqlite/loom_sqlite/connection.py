"""The storage's connections to its file: one on the writer thread, one for the event loop.

Every SQLite call of a storage runs on one of two connections, opened and configured here:

- the **thread connection**, owned by the storage's :class:`~loom_sqlite.writer.WriterThread`
  and used only there. It waits up to ``busy_timeout_ms`` for another process's write
  lock, and it runs every checkpoint of this storage (SQLite's automatic one, and those
  :mod:`loom_sqlite.transactions` runs behind a lone writer: the only writes that sync
  the disk under ``synchronous = NORMAL``);
- the **loop connection** (``synchronous = NORMAL`` only), which the event loop uses for
  an operation that is alone (see :mod:`loom_sqlite.transactions`). Its busy timeout is
  zero, so it never waits for a lock, and its automatic checkpoints are off, so none of
  its commits syncs the disk: a WAL commit under ``NORMAL`` writes its frames to the
  operating system and returns. Under ``FULL`` every commit syncs, so there is no loop
  connection and everything runs on the thread.

Both connections are opened and closed on the thread (closing the last connection
checkpoints the file).
"""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import time
from collections.abc import Callable
from typing import Final, TypeVar, final

from loom_core.errors import StorageError
from loom_sqlite.errors import (
    DatabaseClosedError,
    DatabaseCorruptError,
    DatabaseOpenError,
    DatabaseReadOnlyError,
    translate,
)
from loom_sqlite.settings import Settings
from loom_sqlite.writer import WriterThread

__all__ = ["SqliteConnection", "open_connection"]

T = TypeVar("T")

JOURNAL_MODE_WAL: Final = "PRAGMA journal_mode = WAL"
# PRAGMA takes no bind parameters, so each allowed value is its own constant statement.
SYNCHRONOUS: Final = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}
# The loop connection's: it leaves checkpoints to the thread (see loom_sqlite.transactions).
NO_AUTOCHECKPOINT: Final = "PRAGMA wal_autocheckpoint = 0"
WAL_SIZE_LIMIT: Final = 16 * 1024 * 1024
"""Bytes of ``-wal`` file kept when a checkpoint starts it over; beyond this it is cut back.

SQLite reuses a ``-wal`` file from its start after a checkpoint and never shrinks it, so
one grown large (a reader held open elsewhere pins it for as long as it reads) would keep
its size on the disk until the last connection closes. Four times the 1 000 pages at which
SQLite checkpoints, so a file of the usual size is reused, not cut and grown again."""
JOURNAL_SIZE_LIMIT: Final = f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}"  # a constant
MIN_SQLITE: Final = (3, 35, 0)  # RETURNING and UPSERT with DO UPDATE
CACHED_STATEMENTS: Final = 256


@final
class SqliteConnection:
    """The storage's connections and writer thread; see the module docstring."""

    __slots__ = ("_closed", "file", "loop_raw", "settings", "thread_raw", "writer")

    def __init__(
        self,
        writer: WriterThread,
        thread_raw: sqlite3.Connection,
        loop_raw: sqlite3.Connection | None,
        settings: Settings,
        file: str,
    ) -> None:
        self.writer = writer
        self.thread_raw = thread_raw
        self.loop_raw = loop_raw
        self.settings = settings
        self.file = file
        self._closed = False

    @property
    def path(self) -> str:
        return self.settings.path

    @property
    def closed(self) -> bool:
        return self._closed

    async def call(
        self, fn: Callable[[sqlite3.Connection], T], *, doing: str, write: bool
    ) -> T:
        """Run ``fn(connection)`` on the thread; a ``sqlite3`` error comes back as the
        typed :class:`~loom_core.errors.StorageError` for it."""
        if self._closed:
            raise DatabaseClosedError(self.path)
        raw = self.thread_raw

        def run() -> T:
            try:
                return fn(raw)
            except sqlite3.Error as exc:
                raise self.translate(exc, doing=doing, write=write) from exc

        return await self.writer.call(run)

    def translate(self, exc: sqlite3.Error, *, doing: str, write: bool) -> StorageError:
        return translate(
            exc,
            path=self.path,
            doing=doing,
            write=write,
            busy_timeout_ms=self.settings.busy_timeout_ms,
        )

    async def close(self) -> None:
        """Close both connections on the thread (after any job queued there), then end
        the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.writer.stop(self._close_both)

    def _close_both(self) -> None:
        # The loop's first: the thread connection is then the file's last in this
        # process, and its close checkpoints here, on the thread.
        if self.loop_raw is not None:
            self.loop_raw.close()
        self.thread_raw.close()


def _explain(path: str, exc: sqlite3.Error) -> StorageError:
    """Say why ``path`` could not be opened, in the user's terms."""
    directory = os.path.dirname(os.path.abspath(path))
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        return DatabaseCorruptError(path, str(exc), "opening it")
    if not os.path.isdir(directory):
        return DatabaseOpenError(path, f"the directory {directory!r} does not exist; create it")
    if os.path.isdir(path):
        return DatabaseOpenError(path, "it is a directory, not a file")
    if not os.access(directory, os.W_OK) or (
        os.path.exists(path) and not os.access(path, os.W_OK)
    ):
        return DatabaseOpenError(
            path,
            f"the file or its directory {directory!r} is read-only (SQLite must write the "
            "file and create its -wal and -shm files beside it)",
        )
    if primary == sqlite3.SQLITE_READONLY:
        return DatabaseReadOnlyError(path, "opening it")
    return DatabaseOpenError(path, str(exc))


def _require_directory(path: str) -> None:
    # SQLite's own error for each of these is a bare "unable to open database file".
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        raise DatabaseOpenError(
            path, f"the directory {directory!r} does not exist; create it first"
        ) from None
    except PermissionError:
        raise DatabaseOpenError(
            path, f"the directory {directory!r} cannot be reached (permission denied)"
        ) from None
    except OSError as exc:
        raise DatabaseOpenError(path, f"the directory {directory!r}: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise DatabaseOpenError(path, f"{directory!r} is not a directory")
    if os.path.isdir(path):
        raise DatabaseOpenError(path, "it is a directory, not a file")
    if not os.path.exists(path) and not os.access(directory, os.W_OK):
        raise DatabaseOpenError(
            path,
            f"the directory {directory!r} is read-only, so the file cannot be created "
            "(SQLite also creates its -wal and -shm files there)",
        )


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _while_busy(
    statement: Callable[[], T], settings: Settings, pause: Callable[[float], None]
) -> T:
    """``statement()``, retried with a short, jittered pause while SQLite answers busy.

    Gives up, letting the error out, once ``busy_timeout_ms`` has passed. It runs on the
    connection's own thread, so the pause blocks nothing else. (``pause`` is there for the
    tests that release the lock at the first pause.)
    """
    deadline = time.monotonic() + settings.busy_timeout_ms / 1000
    while True:
        try:
            return statement()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
            pause(random.uniform(0.002, 0.02))


def _switch_to_wal(
    raw: sqlite3.Connection, settings: Settings, pause: Callable[[float], None] = time.sleep
) -> object:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

    Switching a rollback-journal file to WAL reads the file (a SHARED lock) and then needs
    it EXCLUSIVE. When two connections do that at once, each holds what the other waits
    for, so SQLite answers SQLITE_BUSY at once instead of calling the busy handler (which
    could only deadlock). :func:`_while_busy` is the busy handler for that case.
    """
    row = _while_busy(lambda: raw.execute(JOURNAL_MODE_WAL).fetchone(), settings, pause)
    return None if row is None else row[0]


def _configure_loop(
    raw: sqlite3.Connection, settings: Settings, pause: Callable[[float], None] = time.sleep
) -> None:
    """The loop connection's settings, retried while another connection holds the file.

    Its busy timeout is zero, and its first statement reads the schema, which needs a
    read lock: another process opening the same file at that moment (switching it to WAL,
    running WAL recovery, or checkpointing as its last connection closes) holds the file
    for a moment, and without this retry the open would fail at once.
    """
    _while_busy(lambda: raw.execute(SYNCHRONOUS[settings.synchronous]), settings, pause)
    _while_busy(lambda: raw.execute(NO_AUTOCHECKPOINT), settings, pause)
    # The loop's commit can be the first after a checkpoint, the one that starts the file over.
    _while_busy(lambda: raw.execute(JOURNAL_SIZE_LIMIT), settings, pause)


def _configure(raw: sqlite3.Connection, settings: Settings) -> None:
    mode = _switch_to_wal(raw, settings)
    if mode is None or str(mode).lower() != "wal":
        raise DatabaseOpenError(
            settings.path,
            f"SQLite could not switch it to WAL mode (journal_mode is {mode!r}); "
            "loom-sqlite needs WAL, which needs a local file system with shared memory",
        )
    raw.execute(SYNCHRONOUS[settings.synchronous])
    raw.execute(JOURNAL_SIZE_LIMIT)


def _open_on_thread(
    settings: Settings,
) -> tuple[sqlite3.Connection, sqlite3.Connection | None, str]:
    """Open and configure the thread connection, then (under NORMAL) the loop's; and
    the file they opened, ``settings.path`` made absolute.

    Made absolute once, here: a relative path names another file after a chdir, and
    what connects to the database later (a backup) must find the one opened now.
    """
    file = os.path.abspath(settings.path)
    try:
        thread_raw = sqlite3.connect(
            file,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE … COMMIT
            timeout=settings.busy_timeout_ms / 1000,  # the busy handler, without SQL text
            cached_statements=CACHED_STATEMENTS,
        )
    except sqlite3.Error as exc:
        raise _explain(settings.path, exc) from exc
    try:
        _configure(thread_raw, settings)
        if settings.synchronous != "NORMAL":
            return thread_raw, None, file
        # Used by the event loop only, never at the same time as on this thread.
        loop_raw = sqlite3.connect(
            file,
            isolation_level=None,
            timeout=0,  # a lock held elsewhere sends the operation to the thread instead
            cached_statements=CACHED_STATEMENTS,
            check_same_thread=False,
        )
        try:
            _configure_loop(loop_raw, settings)
        except BaseException:
            loop_raw.close()
            raise
    except DatabaseOpenError:
        thread_raw.close()
        raise
    except sqlite3.Error as exc:
        thread_raw.close()
        if _is_busy(exc):
            raise translate(
                exc,
                path=settings.path,
                doing="opening it",
                write=True,
                busy_timeout_ms=settings.busy_timeout_ms,
            ) from exc
        raise _explain(settings.path, exc) from exc
    except BaseException:
        thread_raw.close()
        raise
    return thread_raw, loop_raw, file


async def open_connection(settings: Settings) -> SqliteConnection:
    """Open ``settings.path`` (creating the file, never its directory) in WAL mode.

    Refuses with :class:`~loom_sqlite.errors.DatabaseOpenError` (missing or read-only
    directory, a directory in place of the file), :class:`DatabaseCorruptError` (not a
    database) or :class:`DatabaseBusyError` (another process holds it locked).
    """
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise DatabaseOpenError(
            settings.path,
            f"loom-sqlite needs SQLite >= {'.'.join(map(str, MIN_SQLITE))}; this Python "
            f"links SQLite {sqlite3.sqlite_version}",
        )
    _require_directory(settings.path)
    writer = WriterThread(f"loom-sqlite {os.path.basename(settings.path)}")
    try:
        thread_raw, loop_raw, file = await writer.call(lambda: _open_on_thread(settings))
    except BaseException:
        await writer.stop(lambda: None)
        raise
    return SqliteConnection(writer, thread_raw, loop_raw, settings, file)
