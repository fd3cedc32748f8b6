"""A shard that is down fails only what it owns, with an error naming it; the rest works."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from loom_sharded import ShardedEventStore, ShardUnavailableError, sharded_storage

from loom_core import (
    AppendRequest,
    EventStore,
    LeaseStore,
    NewEvent,
    Storage,
    StorageUnavailableError,
    StorageWriteError,
    TimerRecord,
    TimerStore,
    open_storage,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DOWN = 1


class Backend:
    """Stands for a shard's database server: while it is down every call to any of its
    stores fails the way a client library reports it (``error()``)."""

    def __init__(self) -> None:
        self.error: Callable[[], BaseException] | None = None

    def stop(self, error: Callable[[], BaseException]) -> None:
        self.error = error

    def start(self) -> None:
        self.error = None


class Behind:
    """A store reached through ``backend``: static properties still answer (they do not
    touch the server), every method call fails while the backend is down."""

    def __init__(self, inner: object, backend: Backend) -> None:
        self._inner = inner
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._backend.error is not None:
                raise self._backend.error()
            return target(*args, **kwargs)

        return call


async def behind(backend: Backend, url: str) -> Storage:
    storage = await open_storage("memory://")
    return Storage(
        cast(EventStore, Behind(storage.events, backend)),
        cast(TimerStore, Behind(storage.timers, backend)),
        cast(LeaseStore, Behind(storage.leases, backend)),
        url=url,
    )


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Storage, Backend]]:
    backends = [Backend() for _ in range(3)]
    shards = [
        await behind(backend, f"postgresql://loom:s3cret@db{i}.internal/loom")
        for i, backend in enumerate(backends)
    ]
    async with sharded_storage(shards) as storage:
        yield storage, backends[DOWN]
        backends[DOWN].start()  # so the storage closes cleanly


def ids_on(storage: Storage, shard: int, count: int) -> list[str]:
    events = storage.events
    assert isinstance(events, ShardedEventStore)
    candidates = (f"exec-{n}" for n in itertools.count())
    return list(itertools.islice((i for i in candidates if events.shard_of(i) == shard), count))


OUTAGES: dict[str, Callable[[], BaseException]] = {
    "loom-unavailable": lambda: StorageUnavailableError("connection refused by db1"),
    "driver-error": lambda: ConnectionRefusedError(111, "Connection refused"),
    "closed-pool": lambda: RuntimeError("the pool is closed"),
}


async def append_if_unchanged(storage: Storage, execution_id: str, head: int) -> None:
    token = (await storage.events.acquire_fence_if(execution_id, fence=2**62, park_seq=0)).fence
    await storage.events.append_if_unchanged(
        execution_id, [NewEvent("C")], expected_sequence=head, observed_fence=token
    )


@pytest.mark.parametrize("outage", sorted(OUTAGES))
async def test_a_down_shard_fails_only_its_own_executions_and_names_itself(
    cluster: tuple[Storage, Backend], outage: str
) -> None:
    storage, backend = cluster
    live = ids_on(storage, 0, 2) + ids_on(storage, 2, 2)
    [gone] = ids_on(storage, DOWN, 1)
    for execution_id in [*live, gone]:
        await storage.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
        await storage.timers.schedule(TimerRecord(execution_id, T0))

    backend.stop(OUTAGES[outage])

    calls: dict[str, Callable[[str, int], Awaitable[object]]] = {
        "append": lambda i, h: storage.events.append(i, [NewEvent("B")], expected_sequence=h),
        "read": lambda i, h: storage.events.read(i),
        "head": lambda i, h: storage.events.head(i),
        "acquire_fence": lambda i, h: storage.events.acquire_fence(i),
        "acquire_fence_if": lambda i, h: storage.events.acquire_fence_if(i, fence=0, park_seq=0),
        "append_if_unchanged": lambda i, h: (
            append_if_unchanged(storage, i, h) if i != gone
            else storage.events.append_if_unchanged(
                i, [NewEvent("C")], expected_sequence=h, observed_fence=0
            )
        ),
        "append_many": lambda i, h: storage.events.append_many(
            [AppendRequest(i, [NewEvent("D")], h)]
        ),
        "truncate": lambda i, h: storage.events.truncate_prefix_keeping(i, keep_from_sequence=0),
        "schedule": lambda i, h: storage.timers.schedule(TimerRecord(i, T0 + timedelta(hours=h))),
        "pending": lambda i, h: storage.timers.pending(i),
        "lease": lambda i, h: storage.leases.acquire(i, "node", ttl_seconds=30),
        "inspect": lambda i, h: storage.leases.inspect(i),
    }
    for name, call in calls.items():
        with pytest.raises(ShardUnavailableError) as down:
            await call(gone, 1)
        error = down.value
        assert (error.shard.index, error.shard.name, error.execution_id) == (DOWN, "shard-1", gone)
        assert "shard 1 (shard-1, postgresql://loom:***@db1.internal/loom)" in str(error), name
        assert "s3cret" not in str(error)
        assert isinstance(error, StorageUnavailableError)
        for execution_id in live:
            await call(execution_id, await storage.events.head(execution_id))

    with pytest.raises(ShardUnavailableError, match="shard 1"):
        storage.events.subscribe(gone)
    assert (await anext(storage.events.subscribe(live[0]))).kind == "A"

    backend.start()
    assert await storage.events.head(gone) == 1, "the shard works again once it is back"


async def test_list_executions_refuses_a_page_with_a_shard_missing(
    cluster: tuple[Storage, Backend],
) -> None:
    storage, backend = cluster
    for execution_id in ids_on(storage, 0, 1) + ids_on(storage, DOWN, 1):
        await storage.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
    backend.stop(OUTAGES["driver-error"])
    with pytest.raises(ShardUnavailableError, match=r"shard 1 \(shard-1") as down:
        await storage.events.list_executions()
    assert down.value.execution_id is None
    backend.start()
    assert len(await storage.events.list_executions()) == 2


async def test_due_skips_a_down_shard_reports_it_and_keeps_the_others_firing(
    cluster: tuple[Storage, Backend], caplog: pytest.LogCaptureFixture
) -> None:
    storage, backend = cluster
    rows = {
        shard: TimerRecord(ids_on(storage, shard, 1)[0], T0 + timedelta(seconds=shard))
        for shard in range(3)
    }
    for row in rows.values():
        await storage.timers.schedule(row)
    backend.stop(OUTAGES["loom-unavailable"])
    with caplog.at_level(logging.WARNING, logger="loom_sharded"):
        due = await storage.timers.due(T0 + timedelta(days=1))
    assert due == (rows[0], rows[2])
    assert "shard 1 (shard-1" in caplog.text
    unavailable = storage.timers.unavailable  # type: ignore[attr-defined]
    assert [error.shard.index for error in unavailable] == [DOWN]
    backend.start()
    assert await storage.timers.due(T0 + timedelta(days=1)) == (rows[0], rows[1], rows[2])
    assert storage.timers.unavailable == ()  # type: ignore[attr-defined]


async def test_a_shard_down_for_many_polls_is_warned_of_once_and_its_return_said(
    cluster: tuple[Storage, Backend], caplog: pytest.LogCaptureFixture
) -> None:
    """A timer service polls ``due`` four times a second: a shard down for 100 polls is
    one WARNING as it goes, one INFO as it comes back, and DEBUG lines between."""
    storage, backend = cluster
    backend.stop(OUTAGES["loom-unavailable"])
    with caplog.at_level(logging.DEBUG, logger="loom_sharded"):
        for _ in range(100):
            await storage.timers.due(T0)
        backend.start()
        await storage.timers.due(T0)
        await storage.timers.due(T0)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert "shard 1 (shard-1" in said[0][1]
    assert "shard 1 (shard-1" in said[1][1]
    assert "answers again" in said[1][1]


async def test_a_write_error_keeps_its_meaning_and_gains_the_shard_name(
    cluster: tuple[Storage, Backend],
) -> None:
    storage, backend = cluster
    [gone] = ids_on(storage, DOWN, 1)
    backend.stop(lambda: StorageWriteError("fsync failed; the write may have landed"))
    with pytest.raises(StorageWriteError) as failed:
        await storage.events.append(gone, [NewEvent("A")], expected_sequence=0)
    assert not isinstance(failed.value, StorageUnavailableError)
    assert any("shard 1 (shard-1" in note for note in failed.value.__notes__)


async def test_due_with_every_shard_down_raises_instead_of_finding_nothing_due() -> None:
    backends = [Backend() for _ in range(2)]
    shards = [await behind(backend, f"memory://shard{i}") for i, backend in enumerate(backends)]
    async with sharded_storage(shards) as storage:
        await storage.timers.schedule(TimerRecord("exec-1", T0))
        for backend in backends:
            backend.stop(OUTAGES["driver-error"])
        with pytest.raises(ShardUnavailableError, match="shard 0"):
            await storage.timers.due(T0 + timedelta(days=1))
        for backend in backends:
            backend.start()
        assert len(await storage.timers.due(T0 + timedelta(days=1))) == 1
