"""Store operations, each all-or-nothing, with concurrent writes grouped into one
transaction per thread hop (group commit).

A store method builds an *operation*: a plain function of the ``sqlite3.Connection`` that
does all of its SQL (checks, then writes) and returns the result or raises a
:class:`~loom_core.errors.LoomError`. :class:`TransactionRunner` queues operations; while
one hop to the connection's thread is in flight, new ones wait, and the next hop takes
all of them at once:

- reads run first, each as its own autocommit statement(s);
- writes run in arrival order inside one ``BEGIN IMMEDIATE`` … ``COMMIT``, each inside its
  own ``SAVEPOINT``, so an operation that refuses (a stale fence, a moved head) or fails
  is rolled back alone and gets its own error, while the others commit together.

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

from loom_core.errors import StorageWriteError
from loom_sqlite.connection import SqliteConnection
from loom_sqlite.errors import DatabaseClosedError

__all__ = ["Operation", "TransactionRunner"]

T = TypeVar("T")
Operation: TypeAlias = Callable[[sqlite3.Connection], T]

BEGIN: Final = "BEGIN IMMEDIATE"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
SAVEPOINT: Final = "SAVEPOINT loom_op"
RELEASE: Final = "RELEASE loom_op"
ROLLBACK_TO: Final = "ROLLBACK TO loom_op"
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
                except BaseException as exc:  # the hop itself failed: nobody's op ran
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
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
    def fail_all(error_for: Callable[[_Pending], BaseException]) -> None:
        for index in writes:
            outcomes[index] = (None, error_for(batch[index]))

    try:
        raw.execute(BEGIN)
    except sqlite3.Error as exc:
        fail_all(_translated(exc, connection))
        return
    for index in writes:
        pending = batch[index]
        try:
            raw.execute(SAVEPOINT)
            value = pending.op(raw)
            raw.execute(RELEASE)
        except sqlite3.Error as exc:
            if not raw.in_transaction:
                # SQLite rolled the whole transaction back (an I/O error, a full disk):
                # every write of the batch is gone, not just this one.
                fail_all(_translated(exc, connection))
                return
            error: BaseException = connection.translate(exc, doing=pending.doing, write=True)
            if not _undo(raw):
                fail_all(_translated(exc, connection))
                return
            outcomes[index] = (None, error)
        except Exception as exc:  # a refusal (LoomError) or a bug: this operation only
            if not _undo(raw):
                fail_all(functools.partial(_lost, cause=exc, connection=connection))
                return
            outcomes[index] = (None, exc)
        else:
            outcomes[index] = (value, None)
    try:
        raw.execute(COMMIT)
    except sqlite3.Error as exc:
        _abandon(raw)
        fail_all(functools.partial(_commit_failed, cause=exc, connection=connection))


def _undo(raw: sqlite3.Connection) -> bool:
    """Roll back the current operation's savepoint; False if the transaction is lost."""
    try:
        raw.execute(ROLLBACK_TO)
        raw.execute(RELEASE)
    except sqlite3.Error:
        _abandon(raw)
        return False
    return True


def _translated(
    exc: sqlite3.Error, connection: SqliteConnection
) -> Callable[[_Pending], BaseException]:
    def error_for(pending: _Pending) -> BaseException:
        return connection.translate(exc, doing=pending.doing, write=True)

    return error_for


def _commit_failed(
    pending: _Pending, cause: sqlite3.Error, connection: SqliteConnection
) -> BaseException:
    return StorageWriteError(
        f"SQLite database {connection.path!r}: the commit failed while {pending.doing} "
        f"({cause}); the transaction was rolled back and nothing was written"
    )


def _lost(pending: _Pending, cause: BaseException, connection: SqliteConnection) -> BaseException:
    return StorageWriteError(
        f"SQLite database {connection.path!r}: the transaction carrying this write was "
        f"rolled back ({cause}) while {pending.doing}; nothing was written, retry"
    )


def _abandon(raw: sqlite3.Connection) -> None:
    if raw.in_transaction:
        # If even this fails the connection is unusable, and the next BEGIN reports it.
        with contextlib.suppress(sqlite3.Error):
            raw.execute(ROLLBACK)
