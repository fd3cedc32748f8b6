"""Each tenant's view reads exactly like a private store holding only its own data."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from loom_tenant import tenant_view

from loom_core import NewEvent, Redrive, Storage, TimerRecord, open_storage

T0 = datetime(2030, 1, 1, tzinfo=UTC)
ALPHABET = "aAzZ09-_/:.é日🙂\U0010fffd"
TENANTS = ["a", "a/", "", "1:a/", "ab", "é"]


def random_id(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6)))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_tenants_lists_and_due_rows_match_a_private_store(seed: int) -> None:
    rng = random.Random(seed)
    shared = await open_storage("memory://")
    views = {t: tenant_view(shared, t) for t in TENANTS}
    private: dict[str, Storage] = {t: await open_storage("memory://") for t in TENANTS}
    ids: dict[str, list[str]] = {}
    for tenant in TENANTS:
        ids[tenant] = sorted({random_id(rng) for _ in range(80)})
        for execution_id in ids[tenant]:
            for target in (views[tenant], private[tenant]):
                await target.events.append(
                    execution_id, [NewEvent("A", {"owner": tenant})], expected_sequence=0
                )
            for _ in range(rng.randint(0, 2)):
                row = TimerRecord(
                    execution_id,
                    T0 + timedelta(seconds=rng.randint(0, 30)),
                    Redrive(0) if rng.random() < 0.2 else None,
                )
                for target in (views[tenant], private[tenant]):
                    await target.timers.schedule(row)

    for _ in range(300):
        tenant = rng.choice(TENANTS)
        view, alone = views[tenant], private[tenant]
        after = rng.choice([None, rng.choice(ids[tenant]), random_id(rng)])
        limit = rng.randint(1, 30)
        page = await view.events.list_executions(after=after, limit=limit)
        assert page == await alone.events.list_executions(after=after, limit=limit)
        now = T0 + timedelta(seconds=rng.randint(-1, 35))
        redrive = rng.random() < 0.5
        assert await view.timers.due(now, limit=limit, redrive=redrive) == (
            await alone.timers.due(now, limit=limit, redrive=redrive)
        )
        if page:
            read = await view.events.read(page[0])
            assert [(e.execution_id, e.payload) for e in read] == [
                (e.execution_id, e.payload) for e in await alone.events.read(page[0])
            ]
    await shared.close()
