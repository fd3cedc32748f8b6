"""Over real PostgreSQL: the kit through ``sharded`` with three databases of one server as
its shards, and a shard whose pool is closed under the sharded store.

The kit builds the sharded storage itself (``decorated_factory``: the decorator's
``conformance_options`` opens two more shards, ``colocate="-"``); every storage it opens
gets a fresh schema in the next of the three databases, so each shard of a sharded storage
is a different database.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
from loom_conformance import StorageFactory
from loom_conformance.decorating import decorated_factory
from loom_conformance.postgres import PostgresServer, loom_postgres_server
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_sharded import (
    ShardedEventStore,
    ShardLayoutChangedError,
    ShardUnavailableError,
    check_layout,
    sharded_storage,
)

from loom_core import InvalidOptionError, NewEvent, Storage, TimerRecord, open_storage

__all__ = [
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestTimerStoreContract",
    "loom_postgres_server",
]

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="session")
def shard_urls(loom_postgres_server: PostgresServer) -> list[str]:
    """Three databases on the test server."""
    return [loom_postgres_server.fresh_database(f"loom_shard_{i}") for i in range(3)]


def fresh_schema() -> dict[str, object]:
    return {"schema": f"t_{uuid.uuid4().hex[:16]}"}


@pytest.fixture
def loom_storage_factory(shard_urls: list[str]) -> StorageFactory:
    databases = itertools.cycle(shard_urls)

    async def open_shard() -> Storage:
        return await open_storage(next(databases), options=fresh_schema())

    return decorated_factory("sharded", open_shard)


@pytest.fixture
def loom_explorer_isolation() -> Literal["store", "execution"]:
    """The explorer's 2,047 schedules on their own ids in one storage, not three schemas
    each."""
    return "execution"


async def test_the_kit_storage_spans_three_databases(
    loom_storage_factory: StorageFactory,
) -> None:
    storage = await loom_storage_factory()
    try:
        assert isinstance(storage.events, ShardedEventStore)
        urls = {shard.url.rsplit("/", 1)[-1] for shard in storage.events.placement.shards}
        assert len(urls) == 3
    finally:
        await storage.close()


async def test_a_postgres_shard_that_is_gone_fails_only_its_own_executions(
    shard_urls: list[str],
) -> None:
    schema = fresh_schema()
    shards = [await open_storage(url, options=schema) for url in shard_urls]
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

        await shards[1].close()  # shard 1's pool is gone, as if its server went away

        for execution_id in owned[1]:
            with pytest.raises(ShardUnavailableError) as down:
                await storage.events.append(execution_id, [NewEvent("B")], expected_sequence=1)
            assert down.value.shard.index == 1
            assert down.value.execution_id == execution_id
            assert "loom_shard_1" in str(down.value)
            with pytest.raises(ShardUnavailableError, match="shard 1"):
                await storage.events.read(execution_id)
        for execution_id in owned[0] + owned[2]:
            await storage.events.append(execution_id, [NewEvent("B")], expected_sequence=1)
            assert [e.kind for e in await storage.events.read(execution_id)] == ["A", "B"]
            assert await storage.events.acquire_fence(execution_id) == 1
        with pytest.raises(ShardUnavailableError, match="shard 1"):
            await storage.events.list_executions()
        due = await storage.timers.due(T0 + timedelta(days=1), limit=100)
        assert sorted(r.execution_id for r in due) == sorted(owned[0] + owned[2])


async def test_a_postgres_layout_change_is_refused_at_open(shard_urls: list[str]) -> None:
    schema = fresh_schema()

    async def opened(urls: list[str], colocate: str | None = None) -> Storage:
        shards = [await open_storage(url, options=schema) for url in urls]
        storage = sharded_storage(shards, colocate=colocate)
        try:
            await check_layout(storage)
        except BaseException:
            await storage.close()
            raise
        return storage

    async with await opened(shard_urls[:2]) as storage:
        for n in range(20):
            await storage.events.append(f"order-{n}", [NewEvent("A")], expected_sequence=0)

    with pytest.raises(ShardLayoutChangedError, match=r"added \['shard-2'\]"):
        await opened(shard_urls)
    with pytest.raises(ShardLayoutChangedError, match="reordered"):
        await opened([shard_urls[1], shard_urls[0]])
    with pytest.raises(ShardLayoutChangedError, match="colocate") as refused:
        await opened(shard_urls[:2], colocate="-")
    assert isinstance(refused.value, InvalidOptionError)
    with pytest.raises(ShardLayoutChangedError, match="one database is given as two"):
        await opened([shard_urls[2], shard_urls[2]])

    async with await opened(shard_urls[:2]) as storage:
        assert await storage.events.list_executions() == tuple(
            sorted(f"order-{n}" for n in range(20))
        )
        for n in range(20):
            assert await storage.events.head(f"order-{n}") == 1
