"""Store operations, each all-or-nothing, run where they cost least: on the event loop when
one is alone, on the writer thread in one transaction per batch (group commit) otherwise.

A store method builds an *operation*: a plain function of the ``sqlite3.Connection`` that
does all of its SQL (checks, then writes) and returns the result or raises a
:class:`~loom_core.errors.LoomError`. :class:`TransactionRunner` queues operations and,
once per turn of the event loop, takes what is queued as a *batch*:

- reads run first, each as its own autocommit statement(s);
- writes run in arrival order inside one ``BEGIN IMMEDIATE`` … ``COMMIT``. Every
  operation makes its checks before it writes, so one that refuses (a stale fence, a
  moved head) has changed nothing and simply gets its error while the others commit
  together. One that fails after it started writing (rare: the values themselves were
  refused by SQLite) rolls the whole transaction back, and the others are run again
  without it, so each round drops one operation and the loop ends.

Where a batch runs:

- **on the event loop**, on the loop connection (:mod:`loom_sqlite.connection`), when it
  is a single operation, nothing is on the thread, and the storage is at ``synchronous =
  NORMAL``. A lone caller then pays no thread hop: its operation is a few SQLite calls
  that write to the operating system's cache and return. While operations come one at a
  time, each runs at once in its caller's turn (not one turn later), and the caller
  yields once in ``YIELD_EVERY`` of them, so a task that writes in a loop never keeps the
  others waiting for more than a few of its operations. It
  cannot wait on anything: the loop connection's busy timeout is zero, so if another
  process holds the write lock the operation goes to the thread instead (where it waits
  up to ``busy_timeout_ms``), and it never checkpoints, so it never syncs the disk. One
  that took longer than ``INLINE_STALL_SECONDS`` anyway, ``STALLS_TO_COOL_OFF`` times in a
  row (a disk too slow even for that, not one preemption by a busy machine), sends every
  batch to the thread for the next ``COOL_OFF_SECONDS``. A write that is one statement
  (``one_statement``: a fence acquire, a timer row) runs there with no ``BEGIN`` or
  ``COMMIT`` around it: SQLite runs a lone statement as a transaction of its own;
- **on the writer thread** otherwise: several operations (the thread's one hop and one
  commit are shared), ``synchronous = FULL`` (every commit syncs the disk), or anything
  queued while the thread is busy. The thread wakes the loop once per batch.

A batch's callers are answered together, and most of them ask again at once; a batch
that has just answered several waits up to ``HOLD_TURNS`` more turns of the loop for them
to queue their next operations before the next batch leaves. Without that, a caller whose
next operation comes a turn later (from a task it starts, or a waiter it wakes) misses the
batch, and whatever queued meanwhile leaves alone: from then on the callers run in two
groups half a batch apart, one of them small, and every round pays two commits.

Checkpoints (the writes that sync the disk under ``NORMAL``) run only on the thread: the
thread connection checkpoints as SQLite does by default (a commit that leaves 1 000 pages
or more in the ``-wal`` file copies them back), the loop connection never does. So that the
``-wal`` file does not grow without end at one writer, after ``CHECKPOINT_ROWS`` rows
written on the loop the thread copies the file back *behind* the writer: a passive
checkpoint, which takes no lock a writer needs, so the loop goes on writing meanwhile
(again while the frames written during a pass are many, at most ``BEHIND_PASSES`` times;
a checkpoint slow enough for the writer to write ``BEHIND_ROWS`` times as many rows
meanwhile makes its writes wait behind it on the thread).
Only then does the next write batch go to the thread, where it first copies what was
written since (a few frames) and then finds the file copied back and starts it over,
syncing its header there. A lone writer so waits for a few frames' copy instead of the
whole file's. The write after any other thread write goes to the thread as well: that
commit may have checkpointed (the thread's own 1 000-page rule), and the first commit
after a checkpoint starts the ``-wal`` file over and syncs its header, a sync that belongs
on the thread too. (If another connection holds a read transaction over that commit,
SQLite starts the file over at a later commit, which may then run on the loop.)

Every operation that was in the queue at the same time was concurrent with the others, so
running them in this order is a valid serial order, and each caller's result is delivered
only after the ``COMMIT`` that made it durable. ``BEGIN IMMEDIATE`` takes SQLite's write
lock up front (another process's writes wait, or make this one wait), so the checks an
operation makes and the writes it does cannot interleave with any other writer's, in this
process or another.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import sqlite3
import threading
import time
import types
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias, TypeVar, cast, final

from loom_core.errors import StorageWriteError, WriteOutcomeUnknownError
from loom_sqlite.connection import SqliteConnection
from loom_sqlite.errors import DatabaseClosedError
from loom_sqlite.writer import Outcome

__all__ = ["Operation", "TransactionRunner"]

T = TypeVar("T")
Operation: TypeAlias = Callable[[sqlite3.Connection], T]

BEGIN: Final = "BEGIN IMMEDIATE"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
CHECKPOINT: Final = "PRAGMA wal_checkpoint(PASSIVE)"
# Failures one operation's own values can cause. A full disk is here too: the operation
# that did not fit is dropped and the smaller ones are tried again (on a disk that is
# really full each retry fails at its first write, so that stays cheap).
_OP_SPECIFIC: Final = frozenset(
    {sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_MISMATCH,
     sqlite3.SQLITE_RANGE, sqlite3.SQLITE_FULL}
)
_BUSY: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
MAX_BATCH: Final = 256  # keeps one transaction (and another process's wait) short
# 1 000 rows are about 900 to 1 500 pages of the -wal file: an append of one event adds
# 1.5 pages on average, one of three events 2.7.
CHECKPOINT_ROWS: Final = 1000
# A lone append takes about 0.1 ms on the loop. One that takes 20 times that may only
# have been preempted by another process (a busy machine does that now and then); three
# in a row is the disk (or the machine) being slow right now.
INLINE_STALL_SECONDS: Final = 0.002
BEHIND_PASSES: Final = 4
BEHIND_ROWS: Final = 4
"""While the checkpoint behind a lone writer runs, the writer goes on on the loop until it
has written this many times ``CHECKPOINT_ROWS`` rows; then its writes go to the thread."""
"""The most passes of one checkpoint behind the loop's writes (see ``_checkpoint_behind``)."""
FEW_FRAMES: Final = 64
"""Frames few enough for the write owed to the thread to copy while its callers wait."""
HOLD_TURNS: Final = 2
"""After a batch, the next one waits at most this many more turns of the loop for the
callers just answered to queue their next operations (see ``_dispatch``)."""
YIELD_EVERY: Final = 4
"""A caller whose operations run at once yields to the loop after every this many of
them: often enough that no task waits behind it for more than a few operations, rarely
enough that a lone writer does not pay a turn of the loop per call."""
STALLS_TO_COOL_OFF: Final = 3
COOL_OFF_SECONDS: Final = 5.0

_Outcome: TypeAlias = tuple[object, BaseException | None]


class _Checkpoint(enum.Enum):
    """Where the checkpoint of the loop's writes stands (see the module docstring)."""

    IDLE = "none is running or owed"
    RUNNING = "copying the -wal file back on the thread while the loop writes"
    OWED = "copied: the next write goes to the thread, to copy the rest and start over"


_IDLE: Final = _Checkpoint.IDLE
_RUNNING: Final = _Checkpoint.RUNNING
_OWED: Final = _Checkpoint.OWED


@dataclass(slots=True)
class _Pending:
    op: Callable[[sqlite3.Connection], object]
    write: bool
    doing: str
    future: asyncio.Future[object]


class _Reroute(Exception):
    """The loop connection would have had to wait for a lock: run the batch on the thread."""


@dataclass(slots=True)
class _BatchResult:
    outcomes: list[_Outcome]
    changed: int


@final
class TransactionRunner:
    """The only way the stores reach the database; see the module docstring."""

    __slots__ = (
        "_busy",
        "_checkpoint",
        "_checkpoint_rows",
        "_clock",
        "_closing",
        "_connection",
        "_expected",
        "_follow_up",
        "_held",
        "_idle",
        "_inline_after",
        "_lone",
        "_queue",
        "_rows_on_loop",
        "_scheduled",
        "_stalls",
        "_turn_owner",
        "_turns",
    )

    def __init__(self, connection: SqliteConnection) -> None:
        self._connection = connection
        self._queue: list[_Pending] = []
        self._scheduled = False  # a dispatch is due on the loop
        self._busy = False  # a job is on the writer thread
        self._closing = False
        self._lone = True  # the last batch was one operation: the next may run at once
        # The task whose operation ran at once in this turn of the loop (None: none did).
        self._turn_owner: asyncio.Task[object] | None = None
        self._turns = 1  # lone operations left until the caller yields: the first does
        self._idle: asyncio.Event | None = None  # set when close() waits for the queue
        self._inline_after = 0.0
        self._stalls = 0  # inline batches in a row that took INLINE_STALL_SECONDS or more
        self._rows_on_loop = 0  # rows written on the loop since the last thread write
        self._checkpoint_rows = CHECKPOINT_ROWS
        self._follow_up = False  # the next write goes to the thread (see the docstring)
        self._checkpoint = _IDLE
        self._expected = 0  # callers the last batch answered: the next batch waits for them
        self._held = 0  # turns the next batch has waited for them
        self._clock: Callable[[], float] = time.perf_counter

    @property
    def connection(self) -> SqliteConnection:
        return self._connection

    @property
    def path(self) -> str:
        return self._connection.path

    async def read(self, op: Operation[T], *, doing: str) -> T:
        """Run a read-only ``op`` (autocommit: one snapshot per statement)."""
        return cast(T, await self._call(op, write=False, doing=doing))

    async def write(
        self,
        op: Operation[T],
        *,
        doing: str,
        one_statement: bool = False,
    ) -> T:
        """Run ``op`` in a write transaction; its result is returned once committed.

        ``one_statement``: ``op`` runs a single statement, which SQLite runs atomically
        as a transaction of its own; a lone caller's ``op`` then runs on the loop without
        ``BEGIN`` and ``COMMIT`` around it (one statement to run instead of three)."""
        return cast(
            T, await self._call(op, write=True, doing=doing, one_statement=one_statement)
        )

    async def _call(
        self,
        op: Callable[[sqlite3.Connection], object],
        *,
        write: bool,
        doing: str,
        one_statement: bool = False,
    ) -> object:
        if self._closing:
            raise DatabaseClosedError(self.path)
        if self._alone_now(write):
            # The first operation of this turn of the loop, after a batch that was alone
            # too (or the next one of the task that ran it, which has not yielded since):
            # run it now, rather than one turn later. What another task submits in this
            # turn queues, and goes to the thread if it is several.
            owner = self._turn_owner
            if owner is None:
                owner = self._turn_owner = _current_task()
                _call_soon(self._next_turn)
            try:
                value, error = self._run_alone(op, write, doing, one_statement)
            except _Reroute:
                self._turn_owner = None
            else:
                self._turns -= 1
                if not self._turns:
                    # Yield once in YIELD_EVERY lone operations, as a hop would have: a
                    # task that appends in a loop must not keep the others from running
                    # for longer than a few of its operations.
                    self._turns = YIELD_EVERY
                    await _yield_once()
                if error is not None:
                    raise error
                return value
        return await self._submit(op, write=write, doing=doing)

    def _next_turn(self) -> None:
        # Called soon after an operation ran at once: the loop has turned, so the next
        # operation, whoever's, is the first of its turn.
        self._turn_owner = None

    def _submit(
        self, op: Callable[[sqlite3.Connection], object], *, write: bool, doing: str
    ) -> asyncio.Future[object]:
        loop = asyncio.get_running_loop()
        pending = _Pending(op, write, doing, loop.create_future())
        self._queue.append(pending)
        self._schedule(loop)
        return pending.future

    def _alone_now(self, write: bool) -> bool:
        return (
            self._lone
            and (self._turn_owner is None or self._turn_owner is _current_task())
            and not self._queue
            and not self._busy
            and not self._scheduled
            and not (write and self._write_owed_to_thread())
            and self._connection.loop_raw is not None
            and self._clock() >= self._inline_after
        )

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        # One turn later: every task made ready in this turn has queued its operation by
        # then, so a batch that is alone is really alone.
        if not self._scheduled and not self._busy:
            self._scheduled = True
            loop.call_soon(self._dispatch, loop)

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        while self._queue and not batch:
            batch = [p for p in self._queue[:MAX_BATCH] if not p.future.cancelled()]
            del self._queue[:MAX_BATCH]
        return batch

    def _dispatch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = False
        if self._busy:
            return  # the thread's answer dispatches what queued meanwhile
        if len(self._queue) < self._expected and self._held < HOLD_TURNS:
            # The callers the last batch answered have not all queued their next operation
            # yet: one that does so a turn or two later (a task it starts, a waiter it
            # wakes) would otherwise miss this batch and go alone in the next, and stay a
            # batch behind the others from then on, costing a commit of its own each time.
            self._held += 1
            self._scheduled = True
            loop.call_soon(self._dispatch, loop)
            return
        self._expected = self._held = 0
        batch = self._take()
        if not batch:
            self._settle()
            return
        self._lone = len(batch) == 1
        writes = any(p.write for p in batch)
        owed = writes and self._write_owed_to_thread()
        follow_up = owed and self._follow_up
        checkpoint_first = writes and self._checkpoint is _OWED
        if self._inline_allowed(batch, owed):
            try:
                result = self._run_inline(batch)
            except _Reroute:
                pass
            else:
                self._finish(batch, result, loop)
                return
        self._busy = True
        job = functools.partial(
            _run_on_thread,
            raw=self._connection.thread_raw,
            batch=batch,
            connection=self._connection,
            checkpoint_first=checkpoint_first,
        )
        self._connection.writer.submit(
            job,
            functools.partial(self._answered, batch, loop, writes, follow_up, checkpoint_first),
            loop,
        )

    def _write_owed_to_thread(self) -> bool:
        return (
            self._follow_up
            or self._checkpoint is _OWED
            # A checkpoint that falls this far behind (a slow disk) holds the writer back:
            # its writes wait on the thread, behind it, and the -wal file stops growing.
            or self._rows_on_loop >= BEHIND_ROWS * self._checkpoint_rows
        )

    def _wrote_on_loop(self, rows: int) -> None:
        self._rows_on_loop += rows
        if (
            self._rows_on_loop >= self._checkpoint_rows
            and self._checkpoint is _IDLE
            and not self._closing
        ):
            # Copy the -wal file back on the thread while the loop goes on writing; the
            # write after that goes to the thread, to copy what is left and start over.
            self._checkpoint = _RUNNING
            self._connection.writer.submit(
                functools.partial(_checkpoint_behind, self._connection.thread_raw),
                self._checkpointed,
                asyncio.get_running_loop(),
            )

    def _checkpointed(self, outcome: Outcome[None]) -> None:
        # Failed or not (another process checkpointing, say), the owed write's own
        # checkpoint copies whatever is left.
        if self._checkpoint is _RUNNING:
            self._checkpoint = _OWED

    def _inline_allowed(self, batch: list[_Pending], owed: bool) -> bool:
        return (
            len(batch) == 1
            and not owed
            and self._connection.loop_raw is not None
            and self._clock() >= self._inline_after
        )

    def _run_inline(self, batch: list[_Pending]) -> _BatchResult:
        raw = self._connection.loop_raw
        assert raw is not None
        began = self._clock()
        try:
            result = _run_batch(raw, batch, self._connection, inline=True)
            self._wrote_on_loop(result.changed)
            return result
        finally:
            self._timed(began)

    def _run_alone(
        self,
        op: Callable[[sqlite3.Connection], object],
        write: bool,
        doing: str,
        one_statement: bool,
    ) -> _Outcome:
        """``op`` run on the loop as :meth:`_run_inline` runs a batch of one, with no
        batch, future or result built around it: the path of a lone caller's every call."""
        raw = self._connection.loop_raw
        assert raw is not None
        began = self._clock()
        before = raw.total_changes
        try:
            if write:
                if one_statement:
                    return _write_statement(raw, op, doing, self._connection)
                return _write_alone(raw, op, doing, self._connection)
            return _read_one(raw, op, doing, self._connection, inline=True)
        finally:
            self._wrote_on_loop(raw.total_changes - before)
            self._timed(began)

    def _timed(self, began: float) -> None:
        """Count an operation on the loop that took INLINE_STALL_SECONDS or more."""
        ended = self._clock()
        if ended - began < INLINE_STALL_SECONDS:
            self._stalls = 0
        else:
            self._stalls += 1
            if self._stalls >= STALLS_TO_COOL_OFF:
                # Slow right now: stop risking the loop for a while.
                self._stalls = 0
                self._inline_after = ended + COOL_OFF_SECONDS

    def _answered(
        self,
        batch: list[_Pending],
        loop: asyncio.AbstractEventLoop,
        writes: bool,
        follow_up: bool,
        checkpoint_first: bool,
        outcome: Outcome[_BatchResult],
    ) -> None:
        """On the loop, once per thread batch: deliver every result of it."""
        self._busy = False
        if writes:
            self._rows_on_loop = 0
            if checkpoint_first:
                # It copied the -wal file back and then started it over with its write;
                # unless it wrote nothing (refused, or failed), which starts nothing: the
                # next write is owed to the thread still.
                if outcome.error is None and outcome.value is not None and outcome.value.changed:
                    self._checkpoint = _IDLE
                self._follow_up = False
            else:
                # Its commit checkpointed if the -wal file had grown enough; the next
                # write starts the file over if so, and goes to the thread too (unless
                # it is that).
                self._follow_up = not follow_up
        if outcome.error is not None:
            # The job itself failed (the thread could not run it): no operation ran.
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(outcome.error)
            self._next(loop)
            return
        result = outcome.value
        assert result is not None
        self._finish(batch, result, loop)

    def _finish(
        self, batch: list[_Pending], result: _BatchResult, loop: asyncio.AbstractEventLoop
    ) -> None:
        for pending, (value, error) in zip(batch, result.outcomes, strict=True):
            if pending.future.done():
                continue
            if error is None:
                pending.future.set_result(value)
            else:
                pending.future.set_exception(error)
        self._expected = len(batch)
        self._next(loop)

    def _next(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._queue:
            # Scheduled after the wake-ups of the callers just answered, so what they
            # queue next joins the same batch.
            self._schedule(loop)
        else:
            self._settle()

    def _settle(self) -> None:
        if self._idle is not None and not self._queue and not self._busy:
            self._idle.set()

    def _occupy(self, gate: threading.Event) -> asyncio.Future[None]:
        """Hold the writer thread until ``gate`` is set; what is submitted meanwhile
        queues behind it, as behind a slow batch. For the tests that force a batch."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._busy = True

        def released(outcome: Outcome[bool]) -> None:
            self._busy = False
            done.set_result(None)
            self._next(loop)

        self._connection.writer.submit(gate.wait, released, loop)
        return done

    async def close(self) -> None:
        """Let queued operations finish, then close the connection. Idempotent."""
        self._closing = True
        if self._queue or self._busy or self._scheduled:
            self._idle = asyncio.Event()
            self._settle()
            await self._idle.wait()
        await self._connection.close()


_current_task: Final = asyncio.current_task


def _call_soon(callback: Callable[[], None]) -> None:
    asyncio.get_running_loop().call_soon(callback)


@types.coroutine
def _yield_once() -> Generator[None, None, None]:
    """``await asyncio.sleep(0)`` without its coroutine: the loop runs every other ready
    task once, then resumes the caller (a lone caller pays this once in YIELD_EVERY
    calls)."""
    yield


def _run_on_thread(
    *,
    raw: sqlite3.Connection,
    batch: Sequence[_Pending],
    connection: SqliteConnection,
    checkpoint_first: bool,
) -> _BatchResult:
    if checkpoint_first:
        # The frames written since the background checkpoint: then this batch's first
        # write finds the file copied back and starts it over (syncing its header here).
        _checkpoint_passive(raw)
    return _run_batch(raw, batch, connection, inline=False)


def _checkpoint_behind(raw: sqlite3.Connection) -> None:
    """Copy the -wal file back while the loop goes on writing: again while the frames
    written during the last pass are many, so that the owed write has few left to copy."""
    before = -FEW_FRAMES
    for _ in range(BEHIND_PASSES):
        try:
            _, frames, _ = raw.execute(CHECKPOINT).fetchone()
        except sqlite3.Error:
            return
        if frames - before < FEW_FRAMES:
            return  # this pass copied what the last one left: few (or the file restarted)
        before = frames


def _checkpoint_passive(raw: sqlite3.Connection) -> None:
    """Copy what the -wal file holds back into the database file, as far as no reader
    needs it, without waiting for anyone; an error (another process checkpointing)
    leaves it to a later checkpoint."""
    with contextlib.suppress(sqlite3.Error):
        raw.execute(CHECKPOINT).fetchall()


def _run_batch(
    raw: sqlite3.Connection,
    batch: Sequence[_Pending],
    connection: SqliteConnection,
    *,
    inline: bool,
) -> _BatchResult:
    """The reads, then the writes in one transaction; on the loop when ``inline``, where
    a lock held elsewhere raises :class:`_Reroute` before anything was written."""
    outcomes: list[_Outcome] = [(None, None)] * len(batch)
    before = raw.total_changes
    writes: list[int] = []
    for index, pending in enumerate(batch):
        if pending.write:
            writes.append(index)
            continue
        outcomes[index] = _read_one(raw, pending.op, pending.doing, connection, inline)
    if writes:
        _run_writes(raw, batch, writes, outcomes, connection, inline)
    return _BatchResult(outcomes, raw.total_changes - before)


def _read_one(
    raw: sqlite3.Connection,
    op: Callable[[sqlite3.Connection], object],
    doing: str,
    connection: SqliteConnection,
    inline: bool,
) -> _Outcome:
    try:
        return (op(raw), None)
    except sqlite3.Error as exc:
        if inline and _busy(exc):
            raise _Reroute from exc
        return (None, connection.translate(exc, doing=doing, write=False))
    except Exception as exc:
        return (None, exc)


def _write_alone(
    raw: sqlite3.Connection,
    op: Callable[[sqlite3.Connection], object],
    doing: str,
    connection: SqliteConnection,
) -> _Outcome:
    """One write on the loop connection in its own transaction, as :func:`_attempt`
    runs a batch of one."""
    failed = _begin(raw, inline=True)
    if failed is not None:
        return (None, connection.translate(failed, doing=doing, write=True))
    try:
        outcome = _write_one(raw, op, doing, connection)
    except _Undone as undone:
        return (None, undone.error)
    failed = _commit(raw)
    if failed is not None:
        return (None, _commit_failed(doing, failed, connection))
    return outcome


def _write_statement(
    raw: sqlite3.Connection,
    op: Callable[[sqlite3.Connection], object],
    doing: str,
    connection: SqliteConnection,
) -> _Outcome:
    """A write of one statement on the loop connection, outside a transaction, so that
    the statement is one, committed when it returns.

    Its errors are a commit's too: another writer's lock sends it to the thread
    (:class:`_Reroute`, nothing written), and an I/O error may have landed
    (:func:`_commit_failed`)."""
    try:
        return (op(raw), None)
    except sqlite3.Error as exc:
        if _busy(exc):
            raise _Reroute from exc
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _COMMIT_MAYBE_LANDED:
            return (None, _commit_failed(doing, exc, connection))
        return (None, connection.translate(exc, doing=doing, write=True))
    except Exception as exc:
        return (None, exc)


def _busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _BUSY


def _run_writes(
    raw: sqlite3.Connection,
    batch: Sequence[_Pending],
    writes: list[int],
    outcomes: list[_Outcome],
    connection: SqliteConnection,
    inline: bool,
) -> None:
    remaining = list(writes)
    while remaining:
        culprit = _attempt(raw, batch, remaining, outcomes, connection, inline)
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
    inline: bool,
) -> int | None:
    """One transaction over ``remaining``; the index to drop and retry without, or None."""

    def fail_all(error_for: Callable[[str], BaseException]) -> None:
        for index in remaining:
            outcomes[index] = (None, error_for(batch[index].doing))

    failed = _begin(raw, inline)
    if failed is not None:
        fail_all(_translated(failed, connection))
        return None
    for index in remaining:
        pending = batch[index]
        try:
            outcomes[index] = _write_one(raw, pending.op, pending.doing, connection)
        except _Undone as undone:
            if undone.lost is not None:
                # The file or the disk failed, not this operation: every write is lost.
                fail_all(_translated(undone.lost, connection))
                return None
            outcomes[index] = (None, undone.error)
            return index
    failed = _commit(raw)
    if failed is not None:
        # Refusals too: they were judged against writes that did not commit.
        fail_all(functools.partial(_commit_failed, cause=failed, connection=connection))
    return None


class _Undone(Exception):
    """An operation failed after it had started writing; the transaction is rolled back.
    ``lost`` is the error when the file or the disk failed rather than the operation's
    own values (every write of the transaction is lost then)."""

    def __init__(self, error: BaseException, lost: sqlite3.Error | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.lost = lost


def _begin(raw: sqlite3.Connection, inline: bool) -> sqlite3.Error | None:
    """``BEGIN IMMEDIATE``; the error if it failed. On the loop, a lock held elsewhere
    raises :class:`_Reroute` instead (nothing was written)."""
    try:
        raw.execute(BEGIN)
    except sqlite3.Error as exc:
        if inline and _busy(exc):
            raise _Reroute from exc
        return exc
    return None


def _write_one(
    raw: sqlite3.Connection,
    op: Callable[[sqlite3.Connection], object],
    doing: str,
    connection: SqliteConnection,
) -> _Outcome:
    """Run one write ``op`` in the open transaction: its outcome when it succeeded or was
    refused before writing anything (the transaction goes on); :class:`_Undone` when it
    failed after writing (the transaction is rolled back)."""
    before = raw.total_changes
    try:
        return (op(raw), None)
    except Exception as exc:
        error: BaseException = exc
        if isinstance(exc, sqlite3.Error):
            error = connection.translate(exc, doing=doing, write=True)
        if raw.in_transaction and raw.total_changes == before:
            # Refused (or failed) before writing anything: nothing to undo.
            return (None, error)
        _abandon(raw)
        lost = exc if isinstance(exc, sqlite3.Error) and not _op_specific(exc) else None
        raise _Undone(error, lost) from exc


def _commit(raw: sqlite3.Connection) -> sqlite3.Error | None:
    """``COMMIT``; the error if it failed (the transaction is rolled back then)."""
    try:
        raw.execute(COMMIT)
    except sqlite3.Error as exc:
        _abandon(raw)
        return exc
    return None


def _op_specific(exc: sqlite3.Error) -> bool:
    """An error caused by one operation's values, not by the file or the disk."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in _OP_SPECIFIC


def _translated(exc: sqlite3.Error, connection: SqliteConnection) -> Callable[[str], BaseException]:
    def error_for(doing: str) -> BaseException:
        return connection.translate(exc, doing=doing, write=True)

    return error_for


# A COMMIT that fails with an I/O error may already have written its commit frame to the
# -wal file (SQLite writes the frames, then syncs, then updates the wal-index): no reader
# sees it, but after a crash the next opener rebuilds the index from the file and the
# transaction appears. Every other commit failure (full, busy, read-only) wrote nothing.
_COMMIT_MAYBE_LANDED: Final = frozenset({sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOMEM})


def _commit_failed(doing: str, cause: sqlite3.Error, connection: SqliteConnection) -> BaseException:
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in _COMMIT_MAYBE_LANDED:
        return WriteOutcomeUnknownError(
            doing,
            connection.path,
            f"the commit failed with an I/O error: {cause}; the transaction may be in the "
            "-wal file and appear after a crash",
        )
    return StorageWriteError(
        f"SQLite database {connection.path!r}: the commit failed while {doing} "
        f"({cause}); the transaction was rolled back and nothing was written"
    )


def _abandon(raw: sqlite3.Connection) -> None:
    if raw.in_transaction:
        # If even this fails the connection is unusable, and the next BEGIN reports it.
        with contextlib.suppress(sqlite3.Error):
            raw.execute(ROLLBACK)
