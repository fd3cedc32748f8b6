"""A worker SIGKILLed while a step is being retried, on SQLite: the recovered execution
goes on from the attempts the log holds, at the instant the log names (see
:mod:`retry_kills`)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import retry_kills
from loom_runtime.records import ATTEMPT_FAILED_KIND
from loom_runtime.testing import ChildProcess, VirtualClock

from loom_core import EventKind


@pytest.mark.parametrize(
    ("mode", "said", "first_wait"),
    [
        # Killed in the wait: the second attempt is made when it was due, not before.
        ("wait", ["attempt 1", "waiting"], 59),
        # Killed in the second attempt: it is made again, under its number.
        ("hang", ["attempt 1", "attempt 2"], 0),
    ],
)
async def test_a_worker_killed_while_a_step_is_retried_goes_on_from_the_next_attempt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, said: list[str],
    first_wait: float,
) -> None:
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    worker = await ChildProcess.spawn(
        sys.executable, retry_kills.__file__, url, mode, stderr=tmp_path / "worker.err"
    )
    try:
        for line in said:
            assert await worker.line() == line, worker.stderr_tail()
    finally:
        worker.kill()
    assert await worker.finish() == -signal.SIGKILL

    clock = VirtualClock()  # where the worker's started: the log's retry_at is 60 s on
    async with retry_kills.app_on(url, clock) as app:  # the same node: recovers o-1
        await clock.advance(first_wait)
        if first_wait:
            assert capsys.readouterr().out == ""  # not before the instant the log names
        await clock.advance(60 - first_wait)
        assert await app.get("o-1").result(timeout=5) == "charged o-1 at attempt 2"
        assert capsys.readouterr().out == "attempt 2\n"
        events = await app.storage.events.read("o-1")
    kinds = [(e.kind, e.payload.get("attempt") if isinstance(e.payload, dict) else None)
             for e in events]
    assert kinds == [
        (EventKind.EXECUTION_STARTED, None),
        (ATTEMPT_FAILED_KIND, 1),
        (EventKind.EXECUTION_RECOVERED, None),
        (EventKind.STEP_COMPLETED, 2),
        (EventKind.EXECUTION_COMPLETED, None),
    ]
