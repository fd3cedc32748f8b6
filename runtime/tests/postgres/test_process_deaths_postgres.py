"""Worker processes SIGKILLed at random points, on PostgreSQL: every execution completes
exactly once, no recorded step runs again, the log stays gapless; and around a sleep and a
message, with senders killed too (see :mod:`waits_kills`).

The server is the harness's throwaway PostgreSQL (``loom_conformance.postgres``: started
here, or ``LOOM_TEST_POSTGRES_URL``). Every trial gets a schema of its own in one fresh
database, named in its URL as libpq's ``options=-csearch_path=...`` (the workers take
nothing but the URL; a database per trial would cost a CREATE DATABASE each).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import quote

import broken_worker
import pytest
from loom_conformance.postgres import PostgresServer, loom_postgres_server
from loom_runtime.demo import run_trial, violations
from random_kills import kill_at_random, seed_from_environment
from waits_kills import kill_around_waits

from loom_core import open_storage

__all__ = ["loom_postgres_server"]  # the session's server, a fixture


async def schema_url(database: str) -> str:
    """``database``'s URL with a new schema, its tables made, first on the search path."""
    schema = f"kill_{uuid.uuid4().hex[:16]}"
    async with open_storage(database, options={"schema": schema}):
        pass
    return f"{database}?options={quote(f'-csearch_path={schema}')}"


async def test_a_worker_killed_30_times_at_random_points_completes_every_execution_once(
    loom_postgres_server: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = loom_postgres_server.fresh_database("loom_kill")
    summary = await kill_at_random(
        lambda index: schema_url(database),
        tmp_path,
        deaths=30,
        seed=seed_from_environment(),
    )
    with capsys.disabled():
        print(summary.line("PostgreSQL"))


async def test_workers_and_senders_killed_around_a_sleep_and_a_message_lose_and_repeat_nothing(
    loom_postgres_server: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = loom_postgres_server.fresh_database("loom_kill_waits")
    summary = await kill_around_waits(
        lambda index: schema_url(database), tmp_path, deaths=15, seed=seed_from_environment()
    )
    with capsys.disabled():
        print(summary.line("PostgreSQL"))


async def test_the_check_catches_a_worker_whose_effects_run_outside_their_steps(
    loom_postgres_server: PostgresServer, tmp_path: Path
) -> None:
    trial = await run_trial(
        await schema_url(loom_postgres_server.fresh_database("loom_kill")),
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
