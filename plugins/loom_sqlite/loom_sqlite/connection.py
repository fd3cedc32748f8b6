"""One aiosqlite connection: opened and configured for Loom, and a way to run a whole
function on its thread in one hop.

aiosqlite runs every ``sqlite3`` call on the connection's own thread and hands the result
back to the event loop; each hand-off costs far more than a small SQLite statement, so a
store operation that issued its statements one by one through ``aiosqlite`` would spend
most of its time hopping. :meth:`SqliteConnection.call` instead ships one function that
does all of an operation's (or a batch of operations') work with the plain
``sqlite3.Connection`` on that thread. aiosqlite has no public name for this, so it uses
``Connection._execute`` (there in the aiosqlite releases this was tested with, up to
0.22); :func:`open_connection` checks it is there and refuses clearly if a later
aiosqlite removes it.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import stat
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, cast, final

import aiosqlite

from loom_core.errors import StorageError
from loom_sqlite.errors import (
    DatabaseBusyError,
    DatabaseClosedError,
    DatabaseCorruptError,
    DatabaseOpenError,
    DatabaseReadOnlyError,
    translate,
)
from loom_sqlite.settings import Settings

__all__ = ["SqliteConnection", "open_connection"]

T = TypeVar("T")

JOURNAL_MODE_WAL: Final = "PRAGMA journal_mode = WAL"
# PRAGMA takes no bind parameters, so each allowed value is its own constant statement.
SYNCHRONOUS: Final = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}
MIN_SQLITE: Final = (3, 35, 0)  # RETURNING and UPSERT with DO UPDATE


@final
class SqliteConnection:
    """The storage's single connection; every SQLite call of the storage goes through
    :meth:`call`, so they run one at a time on one thread."""

    __slots__ = ("_aio", "_closed", "_execute", "settings")

    def __init__(self, aio: aiosqlite.Connection, settings: Settings) -> None:
        self._aio = aio
        self.settings = settings
        self._closed = False
        # aiosqlite's (untyped) hook for running a callable on its thread.
        self._execute = cast(
            Callable[[Callable[[], object]], Awaitable[object]], aio._execute
        )

    @property
    def path(self) -> str:
        return self.settings.path

    @property
    def closed(self) -> bool:
        return self._closed

    async def call(
        self, fn: Callable[[sqlite3.Connection], T], *, doing: str, write: bool
    ) -> T:
        """Run ``fn(connection)`` on the connection's thread; a ``sqlite3`` error comes
        back as the typed :class:`~loom_core.errors.StorageError` for it."""
        if self._closed:
            raise DatabaseClosedError(self.path)
        raw = self._aio._conn

        def run() -> T:
            try:
                return fn(raw)
            except sqlite3.Error as exc:
                raise self.translate(exc, doing=doing, write=write) from exc

        return cast(T, await self._execute(run))

    def translate(self, exc: sqlite3.Error, *, doing: str, write: bool) -> StorageError:
        return translate(
            exc,
            path=self.path,
            doing=doing,
            write=write,
            busy_timeout_ms=self.settings.busy_timeout_ms,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._aio.close()


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


async def _stopped(aio: aiosqlite.Connection) -> None:
    """Wait for a failed connection's thread to end.

    aiosqlite stops the thread of a connection that failed to open without awaiting it;
    if the event loop closed first, the thread's last hand-back would fail on the closed
    loop. Waiting here keeps that inside this call.
    """
    await asyncio.to_thread(aio._thread.join, 10)


def _switch_to_wal(
    raw: sqlite3.Connection, settings: Settings, pause: Callable[[float], None] = time.sleep
) -> object:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

    Switching a rollback-journal file to WAL reads the file (a SHARED lock) and then needs
    it EXCLUSIVE. When two connections do that at once, each holds what the other waits
    for, so SQLite answers SQLITE_BUSY at once instead of calling the busy handler (which
    could only deadlock). This loop is the busy handler for that case: it retries with a
    short, jittered pause until ``busy_timeout_ms`` has passed, then lets the error out.
    It runs on the connection's own thread, so the pause blocks nothing else. (``pause``
    is there for the test that releases the lock at the first pause.)
    """
    deadline = time.monotonic() + settings.busy_timeout_ms / 1000
    while True:
        try:
            row = raw.execute(JOURNAL_MODE_WAL).fetchone()
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            busy = isinstance(code, int) and code & 0xFF in (
                sqlite3.SQLITE_BUSY,
                sqlite3.SQLITE_LOCKED,
            )
            if not busy or time.monotonic() >= deadline:
                raise
            pause(random.uniform(0.002, 0.02))
            continue
        return None if row is None else row[0]


def _configure(raw: sqlite3.Connection, settings: Settings) -> None:
    mode = _switch_to_wal(raw, settings)
    if mode is None or str(mode).lower() != "wal":
        raise DatabaseOpenError(
            settings.path,
            f"SQLite could not switch it to WAL mode (journal_mode is {mode!r}); "
            "loom-sqlite needs WAL, which needs a local file system with shared memory",
        )
    raw.execute(SYNCHRONOUS[settings.synchronous])


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
    if not hasattr(aiosqlite.Connection, "_execute"):
        raise DatabaseOpenError(
            settings.path,
            f"aiosqlite {getattr(aiosqlite, '__version__', '?')} has no Connection._execute, "
            "which loom-sqlite uses to batch work per thread hop; install aiosqlite 0.22 (or "
            "another release that has it)",
        )
    _require_directory(settings.path)
    pending = aiosqlite.connect(
        settings.path,
        isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE … COMMIT
        timeout=settings.busy_timeout_ms / 1000,  # the busy handler, without SQL text
        cached_statements=256,
    )
    try:
        aio = await pending
    except sqlite3.Error as exc:
        await _stopped(pending)
        raise _explain(settings.path, exc) from exc
    connection = SqliteConnection(aio, settings)
    try:
        await connection.call(
            lambda raw: _configure(raw, settings), doing="opening it", write=True
        )
    except DatabaseOpenError:
        await connection.close()
        raise
    except (DatabaseBusyError, DatabaseCorruptError):
        await connection.close()
        raise
    except StorageError as exc:
        await connection.close()
        cause = exc.__cause__
        if isinstance(cause, sqlite3.Error):
            raise _explain(settings.path, cause) from cause
        raise
    return connection
