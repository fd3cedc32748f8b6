"""Worker processes SIGKILLed at random points, on SQLite: every execution completes
exactly once, no recorded step runs again, the log stays gapless."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import broken_worker
import pytest
from loom_runtime.demo import run_trial, violations
from random_kills import kill_at_random, seed_from_environment


def sqlite_url(path: Path) -> str:
    return "sqlite:///" + str(path)


def file_per_trial(directory: Path) -> Callable[[int], Awaitable[str]]:
    async def url_for(index: int) -> str:
        return sqlite_url(directory / f"trial-{index}.db")

    return url_for


async def test_a_worker_killed_100_times_at_random_points_completes_every_execution_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = await kill_at_random(
        file_per_trial(tmp_path),
        tmp_path,
        deaths=100,
        seed=seed_from_environment(),
    )
    with capsys.disabled():
        print(summary.line("SQLite"))


async def test_the_check_catches_a_worker_whose_effects_run_outside_their_steps(
    tmp_path: Path,
) -> None:
    # The broken worker does each step's effect in the body and records it afterwards, so
    # a replay runs the effects again. Killed while it holds in step-4's effect (steps 1
    # and 2 recorded; step 3's result waits for the run's next write, which is step 4's),
    # the restarted worker re-runs both recorded ones: the check must say so, every time.
    trial = await run_trial(
        sqlite_url(tmp_path / "broken.db"),
        "broken",
        tmp_path / "effects",
        hold_at="step-4",
        worker=broken_worker.COMMAND,
    )
    first, second = (w.pid for w in trial.workers)
    assert trial.workers[0].killed
    assert violations(trial) == [
        f"step-1 was recorded by worker 1 (pid {first}) and started again by worker 2 "
        f"(pid {second})",
        "step-1's counter is 2, but its recorded run left it at 1",
        f"step-2 was recorded by worker 1 (pid {first}) and started again by worker 2 "
        f"(pid {second})",
        "step-2's counter is 2, but its recorded run left it at 1",
    ]
