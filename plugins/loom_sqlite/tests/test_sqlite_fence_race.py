"""Two *processes* racing on one file obey the same fence rules as tasks in one process.

Each racer is a real subprocess (``sqlite_worker.py``) with its own connection; the test releases
both at once for every round and checks ADR 0118 D1's invariant on what they report and on
what the file holds.
"""

from __future__ import annotations

import subprocess

from sqlite_helpers import expect_line, finish, send, spawn

from loom_core import NewEvent, Storage

ROUNDS = 40


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


def _race(url: str, roles: tuple[str, str], ids: list[str]) -> dict[str, tuple[str, str]]:
    """Run two racers over ``ids``, releasing both for each id; their answers per id."""
    racers = [spawn("race", url, role, *ids) for role in roles]
    answers: dict[str, tuple[str, str]] = {}
    try:
        for racer in racers:
            expect_line(racer, "ready")
        for execution_id in ids:
            for racer in racers:
                send(racer, "go")
            first, second = (expect_line(r).split(" ", 1) for r in racers)
            assert first[0] == second[0] == execution_id
            answers[execution_id] = (first[1], second[1])
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.close()
            finish(racer)
    finally:
        _reap(racers)
    return answers


def _reap(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


async def test_resume_append_and_conditional_acquire_never_both_win(
    storage: Storage, db_url: str
) -> None:
    ids, tokens = await _parked(storage, ROUNDS)
    answers = _race(db_url, ("resume", "acquire"), ids)
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


async def test_two_conditional_acquires_have_exactly_one_winner(
    storage: Storage, db_url: str
) -> None:
    ids, tokens = await _parked(storage, ROUNDS)
    answers = _race(db_url, ("acquire", "acquire"), ids)
    for execution_id, pair in answers.items():
        winner = tokens[execution_id] + 1
        assert sorted(pair) == ["ok", f"stale {winner}"]
        assert await storage.events.acquire_fence(execution_id) == winner + 1


async def test_fenced_writers_in_two_processes_never_write_under_a_superseded_token(
    storage: Storage, db_url: str
) -> None:
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
