"""Where operations run: a lone one on the event loop, a group on the writer thread.

Every interleaving here is forced, never timed: the test holds the writer thread on a
gate it opens itself (``TransactionRunner._occupy``), holds the file's write lock on its
own connection, or drives the runner's clock by hand. Which thread ran an operation is
observed by running one that returns ``threading.get_ident()``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import loom_sqlite.transactions
import pytest
from loom_sqlite import DatabaseClosedError, SqliteEventStore
from loom_sqlite.transactions import (
    BEHIND_ROWS,
    COOL_OFF_SECONDS,
    HOLD_TURNS,
    INLINE_STALL_SECONDS,
    STALLS_TO_COOL_OFF,
    YIELD_EVERY,
    TransactionRunner,
)
from sqlite_helpers import expect_line, finish, spawn, url_for

from loom_core import (
    ExecutionAlreadyExistsError,
    LoomError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    Storage,
    StoreClosedError,
    open_storage,
)

T = TypeVar("T")
LOOP = threading.get_ident()


def _runner(storage: Storage) -> TransactionRunner:
    events = storage.events
    assert isinstance(events, SqliteEventStore)
    return events._runner


def _ident(raw: sqlite3.Connection) -> int:
    return threading.get_ident()


async def _where(runner: TransactionRunner) -> str:
    """Run one read alone; 'loop' or 'thread', for where it ran."""
    return "loop" if await runner.read(_ident, doing="test") == LOOP else "thread"


async def _until_queued(runner: TransactionRunner, count: int) -> None:
    """Let the tasks just created run up to their submit (a few turns, never a clock)."""
    for _ in range(100):
        if len(runner._queue) >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{len(runner._queue)} operations queued, expected {count}")


def _size(path: str) -> int:
    return os.path.getsize(path)


def _in_background(awaitable: Awaitable[T]) -> asyncio.Task[T]:
    async def run() -> T:
        return await awaitable

    return asyncio.get_running_loop().create_task(run())


async def _until_sent_to_thread(runner: TransactionRunner, call: asyncio.Task[Any]) -> None:
    """Let ``call`` run until it was tried on the loop, found the lock held elsewhere and
    went to the writer thread (a few turns, never a clock)."""
    for _ in range(100):
        if runner._busy:
            return
        assert not call.done(), call
        await asyncio.sleep(0)
    raise AssertionError("the call never went to the writer thread")


async def test_a_lone_operation_runs_on_the_loop_and_a_group_on_the_thread(
    storage: Storage,
) -> None:
    runner = _runner(storage)
    assert await _where(runner) == "loop"
    # Three in one turn: the first may still run at once, the others go together.
    first = await asyncio.gather(*(runner.read(_ident, doing="test") for _ in range(3)))
    assert first[1:] == [first[1], first[1]]
    assert first[1] != LOOP
    # Right after a group, a group goes to the thread whole.
    second = await asyncio.gather(*(runner.read(_ident, doing="test") for _ in range(3)))
    assert LOOP not in second
    # Alone again: on the loop again.
    assert await _where(runner) == "loop"
    assert await _where(runner) == "loop"


async def test_a_lone_writer_yields_once_in_a_few_operations_and_no_task_waits_longer(
    storage: Storage,
) -> None:
    runner = _runner(storage)
    runner._clock = _Clock()  # no operation is ever slow: all run on the loop
    events = storage.events
    await events.append("warm-up", [NewEvent("k")], expected_sequence=0)
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.get_running_loop().create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    seen: list[int] = []
    appends = 6 * YIELD_EVERY
    for sequence in range(appends):
        await events.append("e", [NewEvent("k", {"n": sequence})], expected_sequence=sequence)
        seen.append(ticks)
    stop = True
    await ticking
    # The other task ran once in every YIELD_EVERY appends: never kept waiting longer,
    # and not given a turn of the loop after every append.
    gaps = [later - earlier for earlier, later in zip(seen, seen[YIELD_EVERY:], strict=False)]
    assert gaps == [1] * (appends - YIELD_EVERY)
    assert seen[-1] - before == appends // YIELD_EVERY
    assert await _where(runner) == "loop"
    assert [e.payload for e in await events.read("e")] == [{"n": n} for n in range(appends)]


async def test_under_synchronous_full_nothing_runs_on_the_loop(db_path: Path) -> None:
    async with open_storage(url_for(db_path) + "?synchronous=FULL") as storage:
        runner = _runner(storage)
        assert runner.connection.loop_raw is None
        assert await _where(runner) == "thread"
        await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
        assert await _where(runner) == "thread"


async def test_a_refusal_inside_a_group_leaves_the_others_and_the_store_unchanged(
    storage: Storage,
) -> None:
    events = storage.events
    runner = _runner(storage)
    await events.append("taken", [NewEvent("A")], expected_sequence=0)
    token = await events.acquire_fence("fenced")
    await events.acquire_fence("fenced")
    before = {e: await events.read(e) for e in ("taken", "fenced")}
    gate = threading.Event()
    held = runner._occupy(gate)
    calls = [
        events.append("new-1", [NewEvent("A"), NewEvent("B")], expected_sequence=0),
        events.append("taken", [NewEvent("B")], expected_sequence=0),
        events.append("taken", [NewEvent("B")], expected_sequence=5),
        events.append("fenced", [NewEvent("B")], expected_sequence=0, fence=token),
        events.append("new-2", [NewEvent("A")], expected_sequence=0),
    ]
    tasks = [_in_background(call) for call in calls]
    await _until_queued(runner, len(tasks))
    assert not any(task.done() for task in tasks)
    gate.set()
    await held
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(o) for o in outcomes[1:4]] == [
        ExecutionAlreadyExistsError,
        SequenceConflictError,
        StaleFenceError,
    ]
    assert [e.kind for e in outcomes[0]] == ["A", "B"]  # type: ignore[union-attr]
    assert [e.sequence for e in outcomes[4]] == [0]  # type: ignore[union-attr]
    assert {e: await events.read(e) for e in ("taken", "fenced")} == before
    assert await events.head("new-1") == 2
    assert await events.head("new-2") == 1


async def test_callers_a_batch_answered_join_the_next_batch_though_they_queue_a_turn_late(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three callers' operations go to the thread as one batch; while it runs, a fourth
    # caller queues. Each of the three queues its next operation one turn after its
    # answer, as a caller does whose next operation comes from a task it starts or wakes.
    # The fourth must not go to the thread alone meanwhile: that puts it a batch behind the
    # others, at the price of a commit of its own per batch, for as long as they all run.
    runner = _runner(storage)
    batches: list[int] = []
    run_on_thread = loom_sqlite.transactions._run_on_thread

    def counted(**kwargs: Any) -> Any:
        batches.append(len(kwargs["batch"]))
        return run_on_thread(**kwargs)

    monkeypatch.setattr(loom_sqlite.transactions, "_run_on_thread", counted)
    gate, running = threading.Event(), threading.Event()

    def held(raw: sqlite3.Connection) -> int:
        running.set()
        gate.wait()
        return threading.get_ident()

    async def caller(first: Callable[[sqlite3.Connection], int]) -> list[int]:
        answers = [await runner.read(first, doing="test")]
        await asyncio.sleep(0)
        answers.append(await runner.read(_ident, doing="test"))
        return answers

    occupied = threading.Event()
    occupying = runner._occupy(occupied)  # so that none of the three runs on the loop
    callers = [_in_background(caller(f)) for f in (held, _ident, _ident)]
    await _until_queued(runner, 3)
    occupied.set()
    await occupying
    await asyncio.to_thread(running.wait)  # the thread has taken the three
    late = _in_background(runner.read(_ident, doing="test"))
    await _until_queued(runner, 1)
    gate.set()
    answers = await asyncio.gather(*callers)
    assert await late != LOOP
    assert batches == [3, 4]
    assert LOOP not in [ident for answer in answers for ident in answer]


async def test_the_next_batch_waits_no_more_than_a_few_turns_for_callers_that_do_not_come(
    storage: Storage,
) -> None:
    runner = _runner(storage)
    gate = threading.Event()
    occupying = runner._occupy(gate)
    first = [_in_background(runner.read(_ident, doing="test")) for _ in range(3)]
    await _until_queued(runner, 3)
    gate.set()
    await occupying
    await asyncio.gather(*first)  # three answered; none of them asks again
    late = _in_background(runner.read(_ident, doing="test"))
    # A turn to submit, HOLD_TURNS held, one to run it, one for its task to finish.
    for _ in range(HOLD_TURNS + 3):
        await asyncio.sleep(0)
    assert late.done()
    assert await late == LOOP  # alone, so on the loop


async def test_close_lets_queued_appends_commit_then_refuses(db_path: Path) -> None:
    storage = await open_storage(url_for(db_path))
    runner = _runner(storage)
    gate = threading.Event()
    held = runner._occupy(gate)
    tasks = [
        _in_background(storage.events.append(f"q{i}", [NewEvent("A")], expected_sequence=0))
        for i in range(3)
    ]
    await _until_queued(runner, 3)
    closing = _in_background(storage.close())
    for _ in range(10):
        await asyncio.sleep(0)
    assert not closing.done()  # it waits for the queued appends
    with pytest.raises(StoreClosedError):
        await storage.events.append("late", [NewEvent("A")], expected_sequence=0)
    gate.set()
    await held
    await closing
    assert [len(await task) for task in tasks] == [1, 1, 1]
    with pytest.raises(DatabaseClosedError):
        await storage.events.head("q0")
    async with open_storage(url_for(db_path)) as reopened:
        assert [await reopened.events.head(f"q{i}") for i in range(3)] == [1, 1, 1]
        assert await reopened.events.head("late") == 0


async def test_close_returns_once_the_store_thread_has_ended(tmp_path: Path) -> None:
    # It returned with the thread still running, so a fork right after the close (a
    # server forking its workers) copied a live thread: Python 3.12 and later warn there
    # that the child may deadlock.
    db_path = tmp_path / "thread-ends.db"  # a name no other test's store thread has
    name = f"loom-sqlite {db_path.name}"
    async with open_storage(url_for(db_path)) as storage:
        await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
        assert [t.name for t in threading.enumerate()].count(name) == 1
    assert name not in [t.name for t in threading.enumerate()]


async def test_a_lock_held_elsewhere_sends_the_append_to_the_thread_and_the_loop_runs_on(
    db_path: Path,
) -> None:
    async with open_storage(url_for(db_path)) as storage:
        runner = _runner(storage)
        await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
        holder = sqlite3.connect(db_path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            append = _in_background(
                storage.events.append("e", [NewEvent("B")], expected_sequence=1)
            )
            await _until_sent_to_thread(runner, append)
            for _ in range(10):  # the loop keeps serving other tasks meanwhile
                await asyncio.sleep(0)
            assert not append.done()
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        written = await append
        assert [e.sequence for e in written] == [1]
        assert await storage.events.head("e") == 2


async def test_a_fenced_append_is_refused_after_another_process_took_the_fence(
    db_path: Path,
) -> None:
    url = url_for(db_path)
    async with open_storage(url) as storage:
        token = await storage.events.acquire_fence("x")
        await storage.events.append("x", [NewEvent("A")], expected_sequence=0, fence=token)
        other = spawn("acquire", url, "x")
        assert expect_line(other) == f"token {token + 1}"
        finish(other)
        before = await storage.events.read("x")
        with pytest.raises(StaleFenceError) as refused:
            await storage.events.append("x", [NewEvent("B")], expected_sequence=1, fence=token)
        assert refused.value.current_fence == token + 1
        assert await storage.events.read("x") == before
        assert await _where(_runner(storage)) == "loop"  # the refusal ran at once, alone


class _Clock:
    """The runner's clock, moved by the operations themselves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_slow_operations_in_a_row_send_the_next_ones_to_the_thread_for_a_while(
    storage: Storage,
) -> None:
    runner = _runner(storage)
    clock = _Clock()
    runner._clock = clock

    def slow(raw: sqlite3.Connection) -> int:
        clock.now += INLINE_STALL_SECONDS * 10
        return threading.get_ident()

    # One slow operation between fast ones is a preemption, not a slow disk.
    for _ in range(STALLS_TO_COOL_OFF - 1):
        assert await runner.read(slow, doing="test") == LOOP
    assert await _where(runner) == "loop"
    for _ in range(STALLS_TO_COOL_OFF):
        assert await runner.read(slow, doing="test") == LOOP
    assert await _where(runner) == "thread"
    assert await _where(runner) == "thread"
    clock.now += COOL_OFF_SECONDS
    assert await _where(runner) == "loop"


def _wal_frames(db_path: Path) -> tuple[int, int]:
    """The -wal file's frames, and how many of them are copied back, read by a passive
    checkpoint on a connection of the test's own (it copies what it can first)."""
    with sqlite3.connect(db_path, isolation_level=None) as raw:
        _, frames, copied = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(frames), int(copied)


async def _thread_drained(runner: TransactionRunner) -> None:
    """Wait until the writer thread has run every job before this one, and the loop has
    taken their answers (each job answers with one callback, in order)."""
    await runner.connection.writer.call(lambda: None)


def _hold_thread(runner: TransactionRunner) -> threading.Event:
    """Hold the writer thread until the returned gate is set, as a slow disk would hold a
    checkpoint, without a batch marked in flight: what the loop does meanwhile is what it
    does while the checkpoint runs."""
    gate = threading.Event()
    runner.connection.writer.submit(gate.wait, lambda outcome: None, asyncio.get_running_loop())
    return gate


async def test_a_lone_writer_writes_on_while_the_thread_checkpoints_behind_it(
    db_path: Path,
) -> None:
    async with open_storage(url_for(db_path)) as storage:
        runner = _runner(storage)
        runner._checkpoint_rows = 40
        events = storage.events
        loop = asyncio.get_running_loop()
        await runner.write(
            lambda raw: raw.execute("CREATE TABLE loom_test_rows (n INTEGER)"), doing="test"
        )
        gate = _hold_thread(runner)

        async def write_on() -> list[int]:
            for i in range(40):  # the 40th row starts the checkpoint behind the writer
                await events.append(f"e{i}", [NewEvent("A")], expected_sequence=0)
            where = []
            for i in range(40, 60):
                op, ran = _write_ident_then(None, write_first=False)
                await runner.write(op, doing="test")
                await events.append(f"e{i}", [NewEvent("A")], expected_sequence=0)
                where += ran
            return where

        writer = loop.create_task(write_on())
        try:
            for _ in range(200):  # turns of the loop, never a clock
                if writer.done():
                    break
                await asyncio.sleep(0)
            # The loop went on writing: nothing waited for the thread and its copy.
            assert writer.done()
            assert writer.result() == [LOOP] * 20
        finally:
            gate.set()
            await writer
        await _thread_drained(runner)
        # Copied back, the file can start over: the next write goes to the thread, which
        # starts it over there (syncing its header); then the loop again.
        op, ran = _write_ident_then(None, write_first=True)
        await runner.write(op, doing="test")
        assert ran != [LOOP]
        assert _wal_frames(db_path)[0] <= 2  # started over: that write's page or two
        op, ran = _write_ident_then(None, write_first=True)
        await runner.write(op, doing="test")
        assert ran == [LOOP]
        assert [e.sequence for e in await events.read("e59")] == [0]


async def test_a_checkpoint_far_behind_the_writer_holds_its_writes_back(db_path: Path) -> None:
    async with open_storage(url_for(db_path)) as storage:
        runner = _runner(storage)
        runner._checkpoint_rows = 10
        events = storage.events
        loop = asyncio.get_running_loop()
        gate = _hold_thread(runner)
        try:
            # The 10th row starts the checkpoint (held on the gate, as by a slow disk);
            # the loop writes on until 4 times that many rows.
            for i in range(BEHIND_ROWS * 10):
                await events.append(f"e{i}", [NewEvent("A")], expected_sequence=0)
            held = loop.create_task(
                events.append("held", [NewEvent("A")], expected_sequence=0)
            )
            for _ in range(200):  # turns of the loop, never a clock
                await asyncio.sleep(0)
            assert not held.done()  # waiting behind the checkpoint, on the thread
        finally:
            gate.set()
        assert [e.sequence for e in await held] == [0]
        assert len(await events.list_executions(limit=100)) == BEHIND_ROWS * 10 + 1


async def test_the_write_owed_to_the_thread_stays_owed_until_one_writes(db_path: Path) -> None:
    async with open_storage(url_for(db_path)) as storage:
        runner = _runner(storage)
        runner._checkpoint_rows = 3
        events = storage.events
        for i in range(3):
            await events.append(f"e{i}", [NewEvent("A")], expected_sequence=0)
        await _thread_drained(runner)
        # A refused append writes nothing, so it cannot start the -wal file over: the
        # write after it is still owed to the thread.
        with pytest.raises(ExecutionAlreadyExistsError):
            await events.append("e0", [NewEvent("A")], expected_sequence=0)
        for _ in range(2):
            op, ran = _write_ident_then(None, write_first=False)
            await runner.write(op, doing="test")
            assert ran != [LOOP]
        await events.append("e3", [NewEvent("A")], expected_sequence=0)  # owed: it writes
        assert _wal_frames(db_path)[0] <= 2
        op, ran = _write_ident_then(None, write_first=False)
        await runner.write(op, doing="test")
        assert ran == [LOOP]


async def test_a_reader_holding_the_wal_delays_its_restart_and_loses_nothing(
    db_path: Path,
) -> None:
    async with open_storage(url_for(db_path)) as storage:
        runner = _runner(storage)
        runner._checkpoint_rows = 10
        events = storage.events
        await events.append("held", [NewEvent("A")], expected_sequence=0)
        # Another connection reads in a transaction: no checkpoint may copy past what it
        # sees, so the -wal file cannot start over while it reads.
        reader = sqlite3.connect(db_path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM loom_events").fetchone()[0] == 1
            for i in range(30):
                await events.append(f"e{i}", [NewEvent("A")], expected_sequence=0)
                await _thread_drained(runner)
            assert _wal_frames(db_path)[0] >= 30  # nothing started over
            reader.execute("COMMIT")
        finally:
            reader.close()
        for i in range(30, 60):
            await events.append(f"e{i}", [NewEvent("A")], expected_sequence=0)
            await _thread_drained(runner)
        assert _wal_frames(db_path)[0] < 30  # started over once the reader had gone
        assert len(await storage.events.list_executions(limit=100)) == 61


async def test_checkpoints_run_on_the_thread_and_keep_the_wal_small(db_path: Path) -> None:
    async with open_storage(url_for(db_path)) as storage:
        runner = _runner(storage)
        runner._checkpoint_rows = 2  # two appends of one event
        await storage.events.append("a", [NewEvent("A")], expected_sequence=0)
        await storage.events.append("b", [NewEvent("A")], expected_sequence=0)
        # The checkpoint behind the writer, then the write owed to the thread.
        await _thread_drained(runner)
        runner._checkpoint_rows = 10**9
        await storage.events.append("c", [NewEvent("A")], expected_sequence=0)
        assert await runner.write(_ident, doing="test") == LOOP
        # Any other write to the thread (a group's, here) may checkpoint as it commits; so
        # the write after it goes to the thread too (it would start the -wal file over);
        # then the loop again.
        group = await asyncio.gather(*(runner.write(_ident, doing="test") for _ in range(3)))
        assert group[-1] != LOOP
        assert await runner.write(_ident, doing="test") != LOOP
        assert await runner.write(_ident, doing="test") == LOOP
        runner._checkpoint_rows = 100
        for i in range(3_000):
            await storage.events.append(f"e{i}", [NewEvent("A")], expected_sequence=0)
        # 3 000 commits of a page or two would leave some 12 MB or more in the -wal file
        # if nothing checkpointed; the thread's commits keep it near 1 000 pages.
        assert _size(str(db_path) + "-wal") < 2_000 * 4_120


def test_the_poller_wakes_subscribers_when_another_connection_commits() -> None:
    """``(thread, loop)`` data versions: each of the storage's connections moves only the
    other's; another process moves both, possibly one poll apart (compared with the last
    wake, so that is not missed)."""
    from loom_sqlite.subscribe import _another_committed

    woken_at = (10, 20)
    assert not _another_committed(woken_at, (11, 20))  # the loop's own commit
    assert not _another_committed(woken_at, (10, 21))  # the thread's own commit
    assert _another_committed(woken_at, (11, 21))  # another process, or both of ours
    assert _another_committed(woken_at, (11, -1))  # the loop's version could not be read
    assert _another_committed((10, None), (11, None))  # FULL: one connection
    assert not _another_committed((10, None), (10, None))


# -- a lone write that fails, on the loop -----------------------------------------------


def _write_ident_then(
    fail: BaseException | None, write_first: bool
) -> tuple[Callable[[sqlite3.Connection], int], list[int]]:
    """An operation that records where it ran, writes a row when ``write_first``, then
    raises ``fail`` (or returns)."""
    ran: list[int] = []

    def op(raw: sqlite3.Connection) -> int:
        ran.append(threading.get_ident())
        if write_first:
            raw.execute("INSERT INTO loom_test_rows VALUES (1)")
        if fail is not None:
            raise fail
        return 7

    return op, ran


async def _rows(runner: TransactionRunner) -> int:
    return int(
        await runner.read(
            lambda raw: raw.execute("SELECT count(*) FROM loom_test_rows").fetchone()[0],
            doing="test",
        )
    )


@pytest.mark.parametrize(
    ("fail", "write_first"),
    [
        (None, True),
        (SequenceConflictError("e", 1, 0), False),
        (sqlite3.IntegrityError("refused by a constraint after writing"), True),
        (RuntimeError("an operation's own bug, after writing"), True),
    ],
    ids=["commits", "refused-before-writing", "sqlite-error-after-writing", "bug-after-writing"],
)
async def test_a_lone_write_on_the_loop_commits_or_changes_nothing(
    storage: Storage, fail: BaseException | None, write_first: bool
) -> None:
    runner = _runner(storage)
    await runner.write(
        lambda raw: raw.execute("CREATE TABLE loom_test_rows (n INTEGER)"), doing="test"
    )
    op, ran = _write_ident_then(fail, write_first)
    if fail is None:
        assert await runner.write(op, doing="test") == 7
        assert await _rows(runner) == 1
    else:
        with pytest.raises((LoomError, RuntimeError)) as raised:
            await runner.write(op, doing="writing the test row")
        if isinstance(fail, sqlite3.Error):
            assert "writing the test row" in str(raised.value)  # translated, with what it did
        else:
            assert raised.value is fail
        assert await _rows(runner) == 0
    assert ran == [LOOP]
    connection = runner.connection.loop_raw
    assert connection is not None
    assert not connection.in_transaction
    # The loop's connection is left usable: the next lone write runs there and commits.
    again, ran_again = _write_ident_then(None, True)
    assert await runner.write(again, doing="test") == 7
    assert ran_again == [LOOP]


# -- a write of one statement, alone ------------------------------------------------------


def _in_transaction(raw: sqlite3.Connection) -> tuple[int, bool]:
    raw.execute("INSERT INTO loom_test_rows VALUES (1)")
    return threading.get_ident(), raw.in_transaction


async def test_a_lone_one_statement_write_runs_on_the_loop_as_its_own_transaction(
    storage: Storage,
) -> None:
    runner = _runner(storage)
    await runner.write(
        lambda raw: raw.execute("CREATE TABLE loom_test_rows (n INTEGER)"), doing="test"
    )
    assert await runner.write(_in_transaction, doing="test") == (LOOP, True)
    assert await runner.write(_in_transaction, doing="test", one_statement=True) == (
        LOOP, False
    )
    # In a group it is one write of the group's transaction, on the thread.
    grouped = await asyncio.gather(
        *(runner.write(_in_transaction, doing="test", one_statement=True) for _ in range(3))
    )
    assert all(in_transaction for _, in_transaction in grouped[1:])
    assert LOOP not in {ident for ident, _ in grouped[1:]}
    assert await _rows(runner) == 5


async def test_a_lone_fence_acquire_and_timer_writes_run_one_statement_each(
    storage: Storage,
) -> None:
    from datetime import UTC, datetime

    from loom_core import TimerRecord

    raw = _runner(storage).connection.loop_raw
    assert raw is not None
    ran: list[str] = []
    raw.set_trace_callback(ran.append)
    try:
        assert await storage.events.acquire_fence("x") == 1
        wake_at = datetime(2030, 1, 1, tzinfo=UTC)
        await storage.timers.schedule(TimerRecord("x", wake_at))
        assert await storage.timers.complete("x", wake_at)
        await storage.timers.schedule(TimerRecord("x", wake_at))
        assert await storage.timers.cancel("x") == 1
    finally:
        raw.set_trace_callback(None)
    assert len(ran) == 5, ran
    assert not [s for s in ran if s.strip().upper() in ("BEGIN IMMEDIATE", "COMMIT")], ran
    assert await storage.events.acquire_fence("x") == 2
    assert await storage.timers.pending("x") == ()


async def test_a_lock_held_elsewhere_sends_a_fence_acquire_to_the_thread(
    db_path: Path,
) -> None:
    async with open_storage(url_for(db_path)) as storage:
        runner = _runner(storage)
        assert await storage.events.acquire_fence("x") == 1
        holder = sqlite3.connect(db_path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            acquire = _in_background(storage.events.acquire_fence("x"))
            await _until_sent_to_thread(runner, acquire)
            assert not acquire.done()
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert await acquire == 2
        assert await storage.events.acquire_fence("x") == 3


@pytest.mark.parametrize(
    ("code", "unknown"),
    [
        (sqlite3.SQLITE_IOERR, True),
        (sqlite3.SQLITE_NOMEM, True),
        (sqlite3.SQLITE_FULL, False),
        (sqlite3.SQLITE_CONSTRAINT, False),
    ],
    ids=["ioerr", "nomem", "full", "constraint"],
)
async def test_a_one_statement_write_that_fails_alone_says_whether_it_may_have_landed(
    storage: Storage, code: int, unknown: bool
) -> None:
    """Outside a transaction the statement's end is its commit: an I/O error there may
    have left it in the -wal file, so the caller hears "unknown", never "nothing"."""
    from loom_core import StorageWriteError, WriteOutcomeUnknownError

    runner = _runner(storage)

    def fails(raw: sqlite3.Connection) -> None:
        error = sqlite3.OperationalError("the statement's error")
        error.sqlite_errorcode = code
        raise error

    with pytest.raises(StorageWriteError) as raised:
        await runner.write(fails, doing="writing the test row", one_statement=True)
    assert isinstance(raised.value, WriteOutcomeUnknownError) is unknown, raised.value
    assert "writing the test row" in str(raised.value)
    # A refusal the operation raises itself passes as it is.
    refusal = SequenceConflictError("e", 1, 0)

    def refuses(raw: sqlite3.Connection) -> None:
        raise refusal

    with pytest.raises(SequenceConflictError) as refused:
        await runner.write(refuses, doing="test", one_statement=True)
    assert refused.value is refusal
    assert await _where(runner) == "loop"
