"""Over real SQLite files as shards: the kit through sharded (three files per storage,
``colocate="-"`` as ``conformance_options`` gives), and a shard whose database is closed."""

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import pytest
from loom_conformance import StorageFactory
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_sharded import ShardedEventStore, ShardUnavailableError, sharded_storage

from loom_core import NewEvent, Storage, TimerRecord, open_storage

__all__ = ["TestEventStoreContract", "TestLeaseStoreContract", "TestTimerStoreContract"]

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def loom_storage_factory(tmp_path: Path) -> StorageFactory:
    counter = itertools.count()

    async def open_fresh() -> Storage:
        n = next(counter)
        shards = [await open_storage(sqlite_url(tmp_path / f"s{n}-shard{i}.db")) for i in range(3)]
        return sharded_storage(shards, colocate="-")

    return open_fresh


@pytest.fixture
def loom_explorer_isolation() -> Literal["store", "execution"]:
    """The explorer's 2,047 schedules on their own ids in one storage: three files per
    schedule would take minutes."""
    return "execution"


async def test_a_closed_sqlite_shard_fails_only_its_own_executions(tmp_path: Path) -> None:
    shards = [await open_storage(sqlite_url(tmp_path / f"shard{i}.db")) for i in range(3)]
    async with sharded_storage(shards) as storage:
        events = storage.events
        assert isinstance(events, ShardedEventStore)
        owned: dict[int, list[str]] = {0: [], 1: [], 2: []}
        for n in range(30):
            owned[events.shard_of(f"order-{n}")].append(f"order-{n}")
        for ids in owned.values():
            for execution_id in ids:
                await storage.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
                await storage.timers.schedule(TimerRecord(execution_id, T0))
        await shards[1].close()  # shard 1's database is gone for this process

        for execution_id in owned[1]:
            with pytest.raises(ShardUnavailableError) as down:
                await storage.events.append(execution_id, [NewEvent("B")], expected_sequence=1)
            assert down.value.shard.index == 1
            assert down.value.execution_id == execution_id
            assert "shard1.db" in str(down.value)
            with pytest.raises(ShardUnavailableError, match="shard 1"):
                await storage.timers.pending(execution_id)
        for execution_id in owned[0] + owned[2]:
            await storage.events.append(execution_id, [NewEvent("B")], expected_sequence=1)
            assert [e.kind for e in await storage.events.read(execution_id)] == ["A", "B"]
        with pytest.raises(ShardUnavailableError, match="shard 1"):
            await storage.events.list_executions()
        due = await storage.timers.due(T0 + timedelta(days=1), limit=100)
        assert sorted(r.execution_id for r in due) == sorted(owned[0] + owned[2])
