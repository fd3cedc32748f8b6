"""Over real SQLite files as shards: the kit through sharded (three files per storage,
``colocate="-"`` as ``conformance_options`` gives), a shard whose database is closed, and a
backup that covers every shard or refuses."""

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import loom_sqlite
import pytest
from loom_conformance import StorageFactory
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_sharded import ShardedEventStore, ShardUnavailableError, sharded_storage
from loom_sqlite import SeveralDatabasesError

from loom_core import InvalidOptionError, NewEvent, Storage, TimerRecord, open_storage
from loom_core.decorating import base_stores, find_layer

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


async def _twenty_over_three_files(tmp_path: Path) -> Storage:
    shards = [await open_storage(sqlite_url(tmp_path / f"shard{i}.db")) for i in range(3)]
    storage = sharded_storage(shards)
    for n in range(20):
        await storage.events.append(f"order-{n}", [NewEvent("A", {"n": n})], expected_sequence=0)
    return storage


async def test_the_sharded_store_wraps_every_shard_and_find_layer_does_not_guess(
    tmp_path: Path,
) -> None:
    storage = await _twenty_over_three_files(tmp_path)
    async with storage:
        events = storage.events
        assert isinstance(events, ShardedEventStore)
        assert events.wrapped == events.placement.stores
        assert [s.path for s in events.wrapped] == [  # type: ignore[attr-defined]
            str(tmp_path / f"shard{i}.db") for i in range(3)
        ]
        assert base_stores(storage) == events.wrapped
        assert find_layer(storage, ShardedEventStore) is events


async def test_backup_of_a_sharded_storage_is_refused_not_partial(tmp_path: Path) -> None:
    storage = await _twenty_over_three_files(tmp_path)
    async with storage:
        with pytest.raises(SeveralDatabasesError, match="3 SQLite databases"):
            await loom_sqlite.backup(storage, tmp_path / "copy.db")
    assert not (tmp_path / "copy.db").exists()


async def test_backup_all_of_a_sharded_storage_restores_every_execution(tmp_path: Path) -> None:
    storage = await _twenty_over_three_files(tmp_path)
    out = tmp_path / "backups"
    out.mkdir()
    async with storage:
        written = await loom_sqlite.backup_all(storage, out)
        before = {n: await storage.events.read(f"order-{n}") for n in range(20)}
    assert list(written.values()) == [str(out / f"{i}-shard{i}.db") for i in range(3)]
    # Restored in shard order (the routing names come with it), the copies are the storage.
    copies = [await open_storage(sqlite_url(Path(path))) for path in written.values()]
    async with sharded_storage(copies) as restored:
        ids = await restored.events.list_executions(limit=100)
        assert sorted(ids) == sorted(f"order-{n}" for n in range(20))
        for n in range(20):
            assert await restored.events.read(f"order-{n}") == before[n]


async def test_the_decorated_file_given_again_as_a_shard_is_refused(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "one.db")
    with pytest.raises(InvalidOptionError, match="is the decorated storage itself"):
        await open_storage(url, decorators=[("sharded", {"shards": [url]})])
