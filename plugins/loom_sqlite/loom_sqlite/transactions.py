"""Store operations, each all-or-nothing, with concurrent writes grouped into one
transaction per thread hop (group commit).

A store method builds an *operation*: a plain function of the ``sqlite3.Connection`` that
does all of its SQL (checks, then writes) and returns the result or raises a
:class:`~loom_core.errors.LoomError`. :class:`TransactionRunner` queues operations; while
one hop to the connection's thread is in flight, new ones wait, and the next hop takes
all of them at once:

- reads run first, each as its own autocommit statement(s);
- writes run in arrival order inside one ``BEGIN IMMEDIATE`` … ``COMMIT``. Every
  operation makes its checks before it writes, so one that refuses (a stale fence, a
  moved head) has changed nothing and simply gets its error while the others commit
  together. One that fails after it started writing (rare: the values themselves were
  refused by SQLite) rolls the whole transaction back, and the others are run again
  without it, so each round drops one operation and the loop ends.

Every operation that was in the queue at the same time was concurrent with the others, so
running them in this order is a valid serial order, and each caller's result is delivered
only after the ``COMMIT`` that made it durable. ``BEGIN IMMEDIATE`` takes SQLite's write
lock up front (waiting up to ``busy_timeout_ms`` for another process), so the checks an
operation makes and the writes it does cannot interleave with any other writer's, in this
process or another. A lone caller pays one hop per operation; many concurrent callers
share hops and commits, which is where the throughput comes from.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias, TypeVar, cast, final

from loom_core.errors import StorageWriteError, WriteOutcomeUnknownError
from loom_sqlite.connection import SqliteConnection
from loom_sqlite.errors import DatabaseClosedError

__all__ = ["Operation", "TransactionRunner"]

T = TypeVar("T")
Operation: TypeAlias = Callable[[sqlite3.Connection], T]

BEGIN: Final = "BEGIN IMMEDIATE"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
# Failures one operation's own values can cause. A full disk is here too: the operation
# that did not fit is dropped and the smaller ones are tried again (on a disk that is
# really full each retry fails at its first write, so that stays cheap).
_OP_SPECIFIC: Final = frozenset(
    {sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_MISMATCH,
     sqlite3.SQLITE_RANGE, sqlite3.SQLITE_FULL}
)
MAX_BATCH: Final = 256  # keeps one transaction (and another process's wait) short

_Outcome: TypeAlias = tuple[object, BaseException | None]


@dataclass(slots=True)
class _Pending:
    op: Callable[[sqlite3.Connection], object]
    write: bool
    doing: str
    future: asyncio.Future[object]


@final
class TransactionRunner:
    """The only way the stores reach the database; see the module docstring."""

    __slots__ = ("_closing", "_connection", "_drainer", "_queue")

    def __init__(self, connection: SqliteConnection) -> None:
        self._connection = connection
        self._queue: list[_Pending] = []
        self._drainer: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def connection(self) -> SqliteConnection:
        return self._connection

    @property
    def path(self) -> str:
        return self._connection.path

    async def read(self, op: Operation[T], *, doing: str) -> T:
        """Run a read-only ``op`` (autocommit: one snapshot per statement)."""
        return cast(T, await self._submit(op, write=False, doing=doing))

    async def write(self, op: Operation[T], *, doing: str) -> T:
        """Run ``op`` in a write transaction; its result is returned once committed."""
        return cast(T, await self._submit(op, write=True, doing=doing))

    def _submit(
        self, op: Callable[[sqlite3.Connection], object], *, write: bool, doing: str
    ) -> asyncio.Future[object]:
        if self._closing:
            raise DatabaseClosedError(self.path)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        self._queue.append(_Pending(op, write, doing, future))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = [p for p in self._queue[:MAX_BATCH] if not p.future.cancelled()]
                del self._queue[:MAX_BATCH]
                if not batch:
                    continue
                try:
                    outcomes = await self._connection.call(
                        functools.partial(_run_batch, batch=batch, connection=self._connection),
                        doing="running a batch",
                        write=True,
                    )
                except asyncio.CancelledError:
                    # The loop is shutting down; the batch may still commit on the thread.
                    for pending in (*batch, *self._queue):
                        pending.future.cancel()
                    self._queue.clear()
                    raise
                except Exception as exc:  # the hop was refused (closed): no operation ran
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(exc)
                    continue
                for pending, (value, error) in zip(batch, outcomes, strict=True):
                    if pending.future.done():
                        continue
                    if error is None:
                        pending.future.set_result(value)
                    else:
                        pending.future.set_exception(error)
        finally:
            self._drainer = None

    async def close(self) -> None:
        """Let queued operations finish, then close the connection. Idempotent."""
        self._closing = True
        while self._drainer is not None:
            await asyncio.shield(self._drainer)
        await self._connection.close()


def _run_batch(
    raw: sqlite3.Connection, batch: Sequence[_Pending], connection: SqliteConnection
) -> list[_Outcome]:
    """On the connection's thread: the reads, then the writes in one transaction."""
    outcomes: list[_Outcome] = [(None, None)] * len(batch)
    writes: list[int] = []
    for index, pending in enumerate(batch):
        if pending.write:
            writes.append(index)
            continue
        try:
            outcomes[index] = (pending.op(raw), None)
        except sqlite3.Error as exc:
            outcomes[index] = (None, connection.translate(exc, doing=pending.doing, write=False))
        except Exception as exc:
            outcomes[index] = (None, exc)
    if writes:
        _run_writes(raw, batch, writes, outcomes, connection)
    return outcomes


def _run_writes(
    raw: sqlite3.Connection,
    batch: Sequence[_Pending],
    writes: list[int],
    outcomes: list[_Outcome],
    connection: SqliteConnection,
) -> None:
    remaining = list(writes)
    while remaining:
        culprit = _attempt(raw, batch, remaining, outcomes, connection)
        if culprit is None:
            return
        # It failed half-way through its own writes; everything was rolled back, so run
        # the others again without it (each round drops one, so this ends).
        remaining.remove(culprit)


def _attempt(
    raw: sqlite3.Connection,
    batch: Sequence[_Pending],
    remaining: list[int],
    outcomes: list[_Outcome],
    connection: SqliteConnection,
) -> int | None:
    """One transaction over ``remaining``; the index to drop and retry without, or None."""

    def fail_all(error_for: Callable[[_Pending], BaseException]) -> None:
        for index in remaining:
            outcomes[index] = (None, error_for(batch[index]))

    try:
        raw.execute(BEGIN)
    except sqlite3.Error as exc:
        fail_all(_translated(exc, connection))
        return None
    for index in remaining:
        pending = batch[index]
        before = raw.total_changes
        try:
            value = pending.op(raw)
        except Exception as exc:
            error: BaseException = exc
            if isinstance(exc, sqlite3.Error):
                error = connection.translate(exc, doing=pending.doing, write=True)
            if raw.in_transaction and raw.total_changes == before:
                # Refused (or failed) before writing anything: nothing to undo.
                outcomes[index] = (None, error)
                continue
            _abandon(raw)
            if isinstance(exc, sqlite3.Error) and not _op_specific(exc):
                # The file or the disk failed, not this operation: every write is lost.
                fail_all(_translated(exc, connection))
                return None
            outcomes[index] = (None, error)
            return index
        outcomes[index] = (value, None)
    try:
        raw.execute(COMMIT)
    except sqlite3.Error as exc:
        _abandon(raw)
        # Refusals too: they were judged against writes that did not commit.
        fail_all(functools.partial(_commit_failed, cause=exc, connection=connection))
    return None


def _op_specific(exc: sqlite3.Error) -> bool:
    """An error caused by one operation's values, not by the file or the disk."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _OP_SPECIFIC


def _translated(
    exc: sqlite3.Error, connection: SqliteConnection
) -> Callable[[_Pending], BaseException]:
    def error_for(pending: _Pending) -> BaseException:
        return connection.translate(exc, doing=pending.doing, write=True)

    return error_for


# A COMMIT that fails with an I/O error may already have written its commit frame to the
# -wal file (SQLite writes the frames, then syncs, then updates the wal-index): no reader
# sees it, but after a crash the next opener rebuilds the index from the file and the
# transaction appears. Every other commit failure (full, busy, read-only) wrote nothing.
_COMMIT_MAYBE_LANDED: Final = frozenset({sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOMEM})


def _commit_failed(
    pending: _Pending, cause: sqlite3.Error, connection: SqliteConnection
) -> BaseException:
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in _COMMIT_MAYBE_LANDED:
        return WriteOutcomeUnknownError(
            pending.doing,
            connection.path,
            f"the commit failed with an I/O error: {cause}; the transaction may be in the "
            "-wal file and appear after a crash",
        )
    return StorageWriteError(
        f"SQLite database {connection.path!r}: the commit failed while {pending.doing} "
        f"({cause}); the transaction was rolled back and nothing was written"
    )


def _abandon(raw: sqlite3.Connection) -> None:
    if raw.in_transaction:
        # If even this fails the connection is unusable, and the next BEGIN reports it.
        with contextlib.suppress(sqlite3.Error):
            raw.execute(ROLLBACK)
