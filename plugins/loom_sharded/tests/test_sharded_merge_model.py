"""The merged reads agree with one unsharded store holding the same data."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from loom_sharded import sharded_storage

from loom_core import NewEvent, Redrive, TimerRecord, open_storage

T0 = datetime(2030, 1, 1, tzinfo=UTC)
ALPHABET = "aAzZ09-_/:.é日🙂\U0010fffd"


def random_id(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6)))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_list_executions_and_due_match_an_unsharded_store(seed: int) -> None:
    rng = random.Random(seed)
    reference = await open_storage("memory://")
    storage = sharded_storage([await open_storage("memory://") for _ in range(5)])
    ids = sorted({random_id(rng) for _ in range(300)})
    for execution_id in ids:
        for target in (reference, storage):
            await target.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
        for _ in range(rng.randint(0, 3)):
            row = TimerRecord(
                execution_id,
                T0 + timedelta(seconds=rng.randint(0, 50)),
                Redrive(0) if rng.random() < 0.2 else None,
            )
            for target in (reference, storage):
                await target.timers.schedule(row)

    for _ in range(200):
        after = rng.choice([None, rng.choice(ids), random_id(rng)])
        limit = rng.randint(1, 40)
        assert await storage.events.list_executions(after=after, limit=limit) == (
            await reference.events.list_executions(after=after, limit=limit)
        )
        now = T0 + timedelta(seconds=rng.randint(-1, 55))
        redrive = rng.random() < 0.5
        assert await storage.timers.due(now, limit=limit, redrive=redrive) == (
            await reference.timers.due(now, limit=limit, redrive=redrive)
        )
    await storage.close()
    await reference.close()
