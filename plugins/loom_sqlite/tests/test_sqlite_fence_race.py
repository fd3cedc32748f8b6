"""Two *processes* racing on one file obey the same fence rules as tasks in one process.

Each racer is a real subprocess (``sqlite_worker.py``) with its own connection. Every
interleaving is forced by the test, never left to the scheduler:

- ``together``: the test holds the file's write lock (``BEGIN IMMEDIATE`` on its own
  connection) while it releases both racers, and lets go only once both have read the
  park. So both judge the same park, and both writes are queued on the lock when it is
  released: the window the conditional acquire closes is open in every round, however loaded the
  machine. Either racer may then win; the invariant is checked on what both report and
  on what the file holds.
- ``resume first`` / ``acquire first``: one racer is released and finishes before the
  other is, so each order of the two writes is run, every round.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest
from sqlite_helpers import expect_line, finish, send, spawn

from loom_core import NewEvent, Storage

ROUNDS = 40
# The racers wait on the test's lock for as long as it takes them both to read (a
# 10-minute ceiling, never reached: the lock is released as soon as both said so).
PATIENT = "?busy_timeout_ms=600000"
ORDERS = ("together", "resume first", "acquire first")


async def _parked(storage: Storage, count: int) -> tuple[list[str], dict[str, int]]:
    ids, tokens = [], {}
    for i in range(count):
        execution_id = f"parked-{i}"
        token = await storage.events.acquire_fence(execution_id)
        await storage.events.append(
            execution_id,
            [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")],
            expected_sequence=0,
            fence=token,
        )
        ids.append(execution_id)
        tokens[execution_id] = token
    return ids, tokens


def _answer(racer: subprocess.Popen[str], execution_id: str) -> str:
    line = expect_line(racer)
    got, _, answer = line.partition(" ")
    assert got == execution_id, line
    return answer


def _race(
    db_path: Path, roles: tuple[str, str], ids: list[str], order: str
) -> dict[str, tuple[str, str]]:
    """Run two racers over ``ids`` in ``order``; their answers per id."""
    url = "sqlite:///" + str(db_path) + PATIENT
    racers = [spawn("race", url, role, *ids) for role in roles]
    lock = sqlite3.connect(db_path, isolation_level=None)
    answers: dict[str, tuple[str, str]] = {}
    try:
        for racer in racers:
            expect_line(racer, "ready")
        for execution_id in ids:
            if order == "together":
                lock.execute("BEGIN IMMEDIATE")  # no racer can write until ROLLBACK
                for racer in racers:
                    send(racer, "go")
                for racer in racers:
                    assert _answer(racer, execution_id) == "read"
                lock.execute("ROLLBACK")
                first, second = (_answer(r, execution_id) for r in racers)
            else:
                leader = 0 if order.startswith(roles[0]) else 1
                results: dict[int, str] = {}
                for index in (leader, 1 - leader):
                    send(racers[index], "go")
                    assert _answer(racers[index], execution_id) == "read"
                    results[index] = _answer(racers[index], execution_id)
                first, second = results[0], results[1]
            answers[execution_id] = (first, second)
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.close()
            finish(racer)
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        _reap(racers)
    return answers


def _reap(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.parametrize("order", ORDERS)
async def test_resume_append_and_conditional_acquire_never_both_win(
    storage: Storage, db_path: Path, order: str
) -> None:
    ids, tokens = await _parked(storage, ROUNDS)
    answers = _race(db_path, ("resume", "acquire"), ids, order)
    outcomes = set()
    for execution_id, (resume, acquire) in answers.items():
        park_token = tokens[execution_id]
        log = await storage.events.read(execution_id)
        resumed = [e for e in log if e.kind == "EXECUTION_RESUMED"]
        if resume == "ok":
            # The resume landed first: the acquire saw it past the park and changed nothing.
            assert acquire == f"stale {park_token}"
            assert len(resumed) == 1
            assert resumed[0].fence == park_token
            assert await storage.events.acquire_fence(execution_id) == park_token + 1
        else:
            # The acquire won: the resume under the park's old token was fenced out.
            assert acquire == "ok"
            assert resume == f"stale {park_token + 1}"
            assert resumed == []
            assert await storage.events.acquire_fence(execution_id) == park_token + 2
        outcomes.add("resume won" if resume == "ok" else "acquire won")
    if order != "together":
        assert outcomes == {order.replace(" first", " won")}


@pytest.mark.parametrize("order", ["together", "acquire first"])
async def test_two_conditional_acquires_have_exactly_one_winner(
    storage: Storage, db_path: Path, order: str
) -> None:
    ids, tokens = await _parked(storage, ROUNDS)
    answers = _race(db_path, ("acquire", "acquire"), ids, order)
    for execution_id, pair in answers.items():
        winner = tokens[execution_id] + 1
        assert sorted(pair) == ["ok", f"stale {winner}"]
        if order != "together":
            assert pair == ("ok", f"stale {winner}")
        assert await storage.events.acquire_fence(execution_id) == winner + 1


async def test_fenced_writers_in_two_processes_never_write_under_a_superseded_token(
    storage: Storage, db_url: str
) -> None:
    # No window to force: whatever the interleaving, no acknowledged append may sit
    # under a superseded token, and the log's tokens never go down.
    writers = [spawn("fenced", db_url, "contested", "30", name) for name in ("a", "b")]
    acked: list[tuple[int, int]] = []
    try:
        for writer in writers:
            expect_line(writer, "ready")
        for writer in writers:
            send(writer, "go")
        for writer in writers:
            while (line := expect_line(writer)) != "done":
                _, sequence, token = line.split()
                acked.append((int(sequence), int(token)))
            finish(writer)
    finally:
        _reap(writers)
    log = await storage.events.read("contested")
    assert [e.sequence for e in log] == list(range(len(log)))
    stamped = {e.sequence: e.fence for e in log}
    assert all(stamped[sequence] == token for sequence, token in acked)
    assert len(acked) == len(log)
    # A token only grows, and an append under a token below the current one is refused,
    # so the tokens along the log never go down.
    fences = [e.fence for e in log]
    assert fences == sorted(fences)
    assert all(e.payload["token"] == e.fence for e in log)  # type: ignore[index,call-overload]
