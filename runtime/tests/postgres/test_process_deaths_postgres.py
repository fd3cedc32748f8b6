"""Worker processes SIGKILLed at random points, on PostgreSQL: every execution completes
exactly once, no recorded step runs again, the log stays gapless.

The server is the harness's throwaway PostgreSQL (``loom_conformance.postgres``: started
here, or ``LOOM_TEST_POSTGRES_URL``); every trial gets a fresh database of its own.
"""

from __future__ import annotations

from pathlib import Path

import broken_worker
import pytest
from loom_conformance.postgres import PostgresServer, loom_postgres_server
from loom_runtime.demo import run_trial, violations
from random_kills import kill_at_random, seed_from_environment

__all__ = ["loom_postgres_server"]  # the session's server, a fixture


async def test_a_worker_killed_30_times_at_random_points_completes_every_execution_once(
    loom_postgres_server: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = await kill_at_random(
        lambda index: loom_postgres_server.fresh_database("loom_kill"),
        tmp_path,
        deaths=30,
        seed=seed_from_environment(),
    )
    with capsys.disabled():
        print(summary.line("PostgreSQL"))


async def test_the_check_catches_a_worker_whose_effects_run_outside_their_steps(
    loom_postgres_server: PostgresServer, tmp_path: Path
) -> None:
    trial = await run_trial(
        loom_postgres_server.fresh_database("loom_kill"),
        "broken",
        tmp_path / "effects",
        hold_at="step-3",
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
