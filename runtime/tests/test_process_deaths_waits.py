"""Worker and sender processes SIGKILLed around a durable timer and a message, on SQLite:
the execution completes exactly once, the message is stored once and consumed once, the
sleep is answered no earlier than its time (see :mod:`waits_kills`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from random_kills import seed_from_environment
from waits_kills import kill_around_waits


async def test_workers_and_senders_killed_around_a_sleep_and_a_message_lose_and_repeat_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def url_for(index: int) -> str:
        return f"sqlite:///{tmp_path / f'trial-{index}.db'}"

    summary = await kill_around_waits(
        url_for, tmp_path, deaths=30, seed=seed_from_environment()
    )
    with capsys.disabled():
        print(summary.line("SQLite"))
