"""The one connection pool every store of a storage shares, and how a statement is run
on it: retried while the server restarts, its failure turned into a Loom error."""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from loom_core.errors import (
    StorageError,
    StorageReadError,
    StorageUnavailableError,
    StorageWriteError,
)
from loom_postgres.errors import LockTimeoutError, WriteOutcomeUnknownError
from loom_postgres.failures import Failure, classify, describe
from loom_postgres.options import PostgresOptions

__all__ = [
    "Connection",
    "Database",
    "LostWriteError",
    "Params",
    "PooledConnection",
    "Query",
    "RateLimitedWarner",
    "configure_session",
]

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]
Params: TypeAlias = Sequence[Any] | Mapping[str, Any] | None
Query: TypeAlias = str | sql.Composed

_TRANSIENT_ATTEMPTS: Final = 5

# The server session of a connection that broke with a write in flight, ended (waiting up
# to the given milliseconds for it to exit). Only a session of this role on this database
# is a candidate: a pid that another role or database has since taken is left alone, and
# means ours is gone.
_OURS: Final = """
FROM pg_stat_activity a
WHERE a.pid = %s AND a.pid <> pg_backend_pid()
  AND a.usename = session_user AND a.datname = current_database()
"""
END_SESSION: Final = "SELECT pg_terminate_backend(a.pid, %s::bigint)" + _OURS
# pg_terminate_backend is false both when the wait timed out and when the session exited
# between the scan and the signal; a new statement (a new snapshot) tells them apart.
SESSION_ALIVE: Final = "SELECT 1" + _OURS


class PooledConnection(psycopg.AsyncConnection[TupleRow]):
    """A connection of the store's pool: it keeps one cursor for the store's writes.

    ``conn.execute`` builds a cursor per statement, and with it the adapters that turn
    parameters into wire values and rows into Python values; a write that runs on this
    connection's own cursor finds them already built. The cursor is created on first use
    and lives and dies with its connection. Only the holder of the connection (the pool
    hands each to one caller at a time) uses it.
    """

    _write_cursor: psycopg.AsyncCursor[TupleRow] | None = None

    def write_cursor(self) -> psycopg.AsyncCursor[TupleRow]:
        cursor = self._write_cursor
        if cursor is None:
            cursor = self._write_cursor = self.cursor()
        return cursor


class LostWriteError(WriteOutcomeUnknownError):
    """WriteOutcomeUnknownError as :meth:`Database.fetch` raises it for a write that must
    not be re-run: ``settled`` is True when the server session that ran it has ended, so
    what a read shows now is the write's final outcome."""

    def __init__(self, operation: str, execution_id: str, cause: str, *, settled: bool) -> None:
        self.settled = settled
        state = "its session has ended" if settled else "its session may still be running"
        super().__init__(operation, execution_id, f"{cause}; {state}")


class RateLimitedWarner:
    """Reports a degraded-but-working condition at most once a minute per key."""

    __slots__ = ("_last", "_sink")

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        self._sink = sink
        self._last: dict[str, float] = {}

    def __call__(self, key: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < 60.0:
            return
        self._last[key] = now
        if self._sink is not None:
            self._sink(message)
        else:
            warnings.warn(message, RuntimeWarning, stacklevel=3)


async def configure_session(conn: Connection, options: PostgresOptions) -> None:
    """Session settings every store connection needs, whatever the server's defaults:
    READ COMMITTED (loom_acquire_fence_if refuses anything else), UTC timestamps, UTF8
    text (a URL's client_encoding would stop an id or payload it cannot encode), the
    schema, the lock timeout, and never ``synchronous_commit = off`` (a commit the
    server acknowledged must survive its crash)."""
    settings: list[tuple[str, str]] = [
        ("default_transaction_isolation", "read committed"),
        ("TimeZone", "UTC"),
        ("client_encoding", "UTF8"),
    ]
    if options.schema is not None:
        settings.append(("search_path", options.schema))
    if options.lock_timeout is not None:
        settings.append(("lock_timeout", f"{max(1, round(options.lock_timeout * 1000))}ms"))
    names = [name for name, _ in settings]
    values = [value for _, value in settings]
    await conn.execute(
        "SELECT set_config(n, v, false) FROM unnest(%s::text[], %s::text[]) AS s(n, v)",
        (names, values),
    )
    await conn.execute(
        "SELECT CASE WHEN current_setting('synchronous_commit') = 'off' "
        "THEN set_config('synchronous_commit', 'on', false) END"
    )


class Database:
    """Runs statements on the shared pool.

    A statement that finds no connection, or loses it, is retried with backoff until
    ``reconnect_timeout`` (only when re-running it cannot duplicate anything: reads and
    idempotent upserts); a deadlock is retried a few times; every other failure becomes a
    typed error that says whether anything was written.
    """

    __slots__ = ("_checking", "options", "pool", "warn")

    def __init__(
        self, pool: AsyncConnectionPool[PooledConnection], options: PostgresOptions
    ) -> None:
        self.pool = pool
        self.options = options
        self.warn = RateLimitedWarner(options.on_warn)
        self._checking: asyncio.Task[None] | None = None

    def connection_lost(self) -> None:
        """Drop the pool's broken connections in the background (after a restart every
        idle one is dead), so the next attempts get live ones."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.create_task(self._check())

    async def _check(self) -> None:
        with contextlib.suppress(Exception):
            await self.pool.check()

    async def backoff(self, attempt: int, deadline: float, failure: BaseException) -> None:
        """Sleep before attempt ``attempt + 1``; raise once ``deadline`` has passed."""
        if time.monotonic() >= deadline:
            raise failure
        await asyncio.sleep(min(1.0, 0.02 * 2**attempt))

    async def fetch(
        self,
        query: Query,
        params: Params = None,
        *,
        what: str,
        execution_id: str | None = None,
        write: bool = False,
        idempotent: bool = True,
    ) -> list[TupleRow]:
        """Rows of one statement (autocommit: it is its own transaction).

        ``what`` names the operation in errors. ``write`` with ``idempotent=False`` is
        never re-run after a lost connection: it raises :class:`LostWriteError`, after
        ending the session that ran it.
        """
        deadline = time.monotonic() + self.options.reconnect_timeout
        attempt = 0
        transient = 0
        while True:
            pid: int | None = None
            try:
                async with self.pool.connection() as conn:
                    pid = conn.info.backend_pid
                    cur = await conn.execute(query, params, prepare=True)
                    return await cur.fetchall() if cur.description is not None else []
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                failure = classify(exc)
                if failure in (Failure.CONNECTION, Failure.UNAVAILABLE):
                    self.connection_lost()
                    if failure is Failure.CONNECTION and write and not idempotent:
                        settled = await self.end_session(pid, deadline)
                        raise LostWriteError(
                            what, execution_id or "?", describe(exc), settled=settled
                        ) from exc
                    await self.backoff(attempt, deadline, self.error(exc, what, execution_id,
                                                                      write=write))
                    attempt += 1
                    continue
                if failure is Failure.TRANSIENT and transient < _TRANSIENT_ATTEMPTS:
                    transient += 1
                    await asyncio.sleep(0.005 * transient)
                    continue
                raise self.error(exc, what, execution_id, write=write) from exc

    async def end_session(self, pid: int | None, deadline: float) -> bool:
        """End the server session ``pid`` of a connection that broke with a write in
        flight, and wait for it to exit. True when it has (or was gone already): its
        transaction then has committed or never will, so a read after this sees the
        write's final outcome. False when that is not known by ``deadline``.

        Without this, a transaction still running on the lost session (waiting for a
        lock, or not yet scheduled) can commit after a read found nothing, and a re-run
        of the write would then be refused as a conflict for a write that landed.
        """
        if pid is None:
            return False
        wait_ms = max(1, round((deadline - time.monotonic()) * 1000))
        try:
            rows = await self.fetch(END_SESSION, (wait_ms, pid), what="ending a lost session")
            if not rows or bool(rows[0][0]):
                return True
            rows = await self.fetch(SESSION_ALIVE, (pid,), what="ending a lost session")
        except StorageError:
            return False
        return not rows

    def error(
        self, exc: BaseException, what: str, execution_id: str | None, *, write: bool
    ) -> StorageError:
        """The Loom error for a failure that will not be retried."""
        failure = classify(exc)
        detail = describe(exc)
        target = f" on {execution_id!r}" if execution_id is not None else ""
        if failure is Failure.LOCK_TIMEOUT:
            return LockTimeoutError(what, execution_id, detail)
        if failure in (Failure.CONNECTION, Failure.UNAVAILABLE):
            if write and failure is Failure.CONNECTION:
                return WriteOutcomeUnknownError(what, execution_id or "?", detail)
            return StorageUnavailableError(
                f"{what}{target}: PostgreSQL stayed unreachable for reconnect_timeout "
                f"({self.options.reconnect_timeout}s): {detail}"
                + ("; nothing was written" if write else "")
            )
        if write:
            return StorageWriteError(
                f"{what}{target} was refused by PostgreSQL and rolled back, nothing was "
                f"written: {detail}"
            )
        if failure is Failure.CANCELED:
            return StorageUnavailableError(f"{what}{target} was cancelled: {detail}")
        return StorageReadError(f"{what}{target} failed: {detail}")
