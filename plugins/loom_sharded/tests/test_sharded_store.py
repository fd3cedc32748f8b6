"""The sharded storage over memory shards: routing, merging, refusals, options."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from loom_sharded import CrossShardError, ShardedDecorator, ShardedEventStore, sharded_storage
from loom_sharded import plugin as loom_sharded_plugin

from loom_core import (
    AppendRequest,
    ExecutionNotFoundError,
    InvalidOptionError,
    LeaseHeldError,
    NewEvent,
    Redrive,
    StaleFenceError,
    Storage,
    TimerRecord,
    UnknownSchemeError,
    Unsupported,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, OptionalMethod, PluginHost

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
async def shards() -> AsyncIterator[list[Storage]]:
    opened = [await open_storage("memory://") for _ in range(3)]
    yield opened
    for storage in opened:
        await storage.close()


@pytest.fixture
def sharded(shards: list[Storage]) -> Storage:
    return sharded_storage(shards)


def events_of(storage: Storage) -> ShardedEventStore:
    assert isinstance(storage.events, ShardedEventStore)
    return storage.events


def ids_on(storage: Storage, shard: int, count: int, stem: str = "id") -> list[str]:
    found = (f"{stem}-{n}" for n in itertools.count())
    return list(itertools.islice((i for i in found if events_of(storage).shard_of(i) == shard),
                                 count))


async def test_each_execution_lives_only_on_its_owning_shard(
    sharded: Storage, shards: list[Storage]
) -> None:
    ids = [f"order-{n}" for n in range(30)]
    for execution_id in ids:
        await sharded.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
    for index, shard in enumerate(shards):
        expected = sorted(i for i in ids if events_of(sharded).shard_of(i) == index)
        assert list(await shard.events.list_executions()) == expected
        assert expected, "30 ids should reach every one of 3 shards"


async def test_list_executions_merges_shards_in_code_point_order_with_correct_paging(
    sharded: Storage,
) -> None:
    ids = [f"{prefix}{n}" for prefix in ["a", "B", "é", "🙂", "z/"] for n in range(9)]
    for execution_id in ids:
        await sharded.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
    for limit in [1, 4, 7, 100]:
        seen: list[str] = []
        after: str | None = None
        while page := await sharded.events.list_executions(after=after, limit=limit):
            assert len(page) <= limit
            seen += page
            after = page[-1]
        assert seen == sorted(ids)
    assert await sharded.events.list_executions(after="a8", limit=2) == tuple(
        [i for i in sorted(ids) if i > "a8"][:2]
    )


async def test_fencing_goes_to_the_owning_shard(sharded: Storage, shards: list[Storage]) -> None:
    [execution_id] = ids_on(sharded, 2, 1)
    await sharded.events.append(
        execution_id, [NewEvent("EXECUTION_SUSPENDED")], expected_sequence=0
    )
    token = await sharded.events.acquire_fence(execution_id)
    assert (await shards[2].events.acquire_fence_if(execution_id, fence=99, park_seq=0)).fence == 1
    with pytest.raises(ExecutionNotFoundError):  # shard 0 has never seen it
        await shards[0].events.acquire_fence_if(execution_id, fence=0, park_seq=0)
    won = await sharded.events.acquire_fence_if(execution_id, fence=token, park_seq=0)
    assert won.acquired
    assert won.fence == 2
    with pytest.raises(StaleFenceError):
        await sharded.events.append_if_unchanged(
            execution_id, [NewEvent("X")], expected_sequence=1, observed_fence=1
        )


async def test_append_many_within_one_shard_is_atomic_there(sharded: Storage) -> None:
    first, second = ids_on(sharded, 1, 2)
    written = await sharded.events.append_many(
        [AppendRequest(first, [NewEvent("A")], 0), AppendRequest(second, [NewEvent("B")], 0)]
    )
    assert [[e.execution_id for e in events] for events in written] == [[first], [second]]


async def test_append_many_across_shards_is_refused_and_writes_nothing(sharded: Storage) -> None:
    [here] = ids_on(sharded, 0, 1)
    [there] = ids_on(sharded, 2, 1)
    with pytest.raises(CrossShardError, match="atomic only within one shard") as refused:
        await sharded.events.append_many(
            [AppendRequest(here, [NewEvent("A")], 0), AppendRequest(there, [NewEvent("B")], 0)]
        )
    assert refused.value.placement == {here: 0, there: 2}
    assert f"shard 0: {here!r}" in str(refused.value)
    assert await sharded.events.list_executions() == ()


async def test_copy_prefix_on_one_shard_works_and_across_shards_is_refused(
    sharded: Storage,
) -> None:
    source, target = ids_on(sharded, 1, 2)
    [elsewhere] = ids_on(sharded, 0, 1)
    await sharded.events.append(source, [NewEvent("A"), NewEvent("B")], expected_sequence=0)
    assert await sharded.events.copy_prefix(source, target, through_sequence=0) == 1
    assert [e.kind for e in await sharded.events.read(target)] == ["A"]
    with pytest.raises(CrossShardError, match="neither atomic nor exact"):
        await sharded.events.copy_prefix(source, elsewhere, through_sequence=0)
    assert await sharded.events.head(elsewhere) == 0


async def test_colocated_executions_can_be_appended_and_branched_together(
    shards: list[Storage],
) -> None:
    storage = sharded_storage(shards, colocate="/")
    parent = "order-7"
    children = [f"{parent}/child-{n}" for n in range(6)]
    written = await storage.events.append_many(
        [AppendRequest(i, [NewEvent("A")], 0) for i in [parent, *children]]
    )
    assert len(written) == 7
    assert await storage.events.copy_prefix(parent, f"{parent}/branch", through_sequence=0) == 1
    owner = events_of(storage).shard_of(parent)
    assert len(await shards[owner].events.list_executions()) == 8


async def test_delete_truncate_and_subscribe_route_to_the_owner(sharded: Storage) -> None:
    [execution_id] = ids_on(sharded, 2, 1)
    await sharded.events.append(
        execution_id, [NewEvent("A"), NewEvent("B"), NewEvent("C")], expected_sequence=0
    )
    subscription = sharded.events.subscribe(execution_id, from_sequence=1)
    assert (await anext(subscription)).kind == "B"
    assert await sharded.events.truncate_prefix_keeping(execution_id, keep_from_sequence=2) == 2
    assert [e.kind for e in await sharded.events.read(execution_id)] == ["C"]
    assert await sharded.events.delete_execution(execution_id)
    assert await sharded.events.head(execution_id) == 0


async def test_due_merges_every_shards_rows_in_order_and_respects_the_limit(
    sharded: Storage,
) -> None:
    rows = []
    for shard in range(3):
        for n, execution_id in enumerate(ids_on(sharded, shard, 4, stem=f"t{shard}")):
            rows.append(TimerRecord(execution_id, T0 + timedelta(seconds=3 * n + shard)))
    rows.append(TimerRecord(rows[0].execution_id, T0 + timedelta(hours=1), Redrive(0)))
    for row in rows:
        await sharded.timers.schedule(row)
    ordered = sorted(rows, key=lambda r: (r.wake_at, r.execution_id))
    assert await sharded.timers.due(T0 + timedelta(days=1), limit=5) == tuple(ordered[:5])
    assert await sharded.timers.due(T0 + timedelta(days=1), limit=100) == tuple(ordered)
    plain = [r for r in ordered if r.redrive is None]
    assert await sharded.timers.due(T0 + timedelta(days=1), limit=100, redrive=False) == tuple(
        plain
    )
    assert await sharded.timers.due(T0 + timedelta(seconds=4), limit=100) == tuple(
        r for r in ordered if r.wake_at <= T0 + timedelta(seconds=4)
    )
    first = rows[0]
    assert await sharded.timers.pending(first.execution_id) == (first, rows[-1])
    assert await sharded.timers.complete(first.execution_id, first.wake_at)
    assert await sharded.timers.cancel(first.execution_id) == 1


async def test_timers_and_leases_live_on_the_shard_of_their_key(
    sharded: Storage, shards: list[Storage]
) -> None:
    [execution_id] = ids_on(sharded, 1, 1)
    await sharded.timers.schedule(TimerRecord(execution_id, T0))
    assert len(await shards[1].timers.pending(execution_id)) == 1
    assert await shards[0].timers.pending(execution_id) == ()
    await sharded.leases.acquire(execution_id, "node-a", ttl_seconds=30)
    assert await shards[1].leases.inspect(execution_id) is not None
    assert await shards[2].leases.inspect(execution_id) is None
    with pytest.raises(LeaseHeldError):
        await sharded.leases.acquire(execution_id, "node-b", ttl_seconds=30)
    assert await sharded.leases.release(execution_id, "node-a")
    assert sharded.leases.scope == "process"


@pytest.mark.parametrize("offered", [(), *((m,) for m in OPTIONAL_EVENT_STORE_METHODS)])
async def test_an_optional_method_is_offered_exactly_when_every_shard_offers_it(
    offered: tuple[OptionalMethod, ...],
) -> None:
    shards = [await open_storage("memory://", options={"offer": offered}) for _ in range(3)]
    async with sharded_storage(shards) as storage:
        assert storage.events.capabilities == frozenset(offered)
        for method in set(OPTIONAL_EVENT_STORE_METHODS) - set(offered):
            with pytest.raises(Unsupported, match=method):
                await _call(storage, method)


async def _call(storage: Storage, method: str) -> None:
    result = getattr(storage.events, method)("x", "y")
    if not isinstance(result, AsyncIterator):
        await result


async def test_shards_that_offer_different_methods_are_refused() -> None:
    full = await open_storage("memory://")
    bare = await open_storage("memory://", options={"offer": ()})
    with pytest.raises(InvalidOptionError, match=r"shard 1 \(shard-1, memory://\) differs"):
        sharded_storage([full, bare])


class _Layer(EventStoreDecorator):
    """A decorator of this test's, standing for a tenant or a cipher below the fan-out."""

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=FORWARD,
        append_many=FORWARD,
        delete_execution=FORWARD,
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=FORWARD,
    )


def _layered(storage: Storage) -> Storage:
    return Storage(
        _Layer(storage.events), storage.timers, storage.leases, url=storage.url,
        on_close=storage.close,
    )


async def test_a_layer_on_some_shards_only_is_refused_and_nothing_stays_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layered = _layered(await open_storage("memory://"))
    plain = await open_storage("memory://")
    with pytest.raises(InvalidOptionError, match=r"shard 0 is decorated with \['_Layer'\]"):
        sharded_storage([layered, plain])
    # Below the decorator, shards given as URLs would be opened bare: refused, and what
    # the decorator opened is closed again.
    opened: list[Storage] = []

    async def tracked(url: str) -> Storage:
        opened.append(await open_storage(url))
        return opened[-1]

    monkeypatch.setattr(loom_sharded_plugin, "open_storage", tracked)
    with pytest.raises(InvalidOptionError, match="Put 'sharded' first"):
        await ShardedDecorator().decorate(layered, {"shards": ["memory://"]})
    assert len(opened) == 1
    assert opened[0].closed
    assert not layered.closed
    # Decorated alike, they are taken.
    both = sharded_storage([layered, _layered(plain)])
    assert len(events_of(both).placement.stores) == 2
    await both.close()


async def test_the_entry_point_registers_the_sharded_decorator() -> None:
    host = PluginHost()
    assert host.decorator("sharded").name == "sharded"
    assert host.decorators.source_of("sharded") == "loom-sharded"


async def test_shards_given_as_urls_are_opened_and_closed_with_the_storage() -> None:
    storage = await open_storage(
        "memory://", decorators=[("sharded", {"shards": ["memory://", "MEMORY://"]})]
    )
    events = events_of(storage)
    assert len(events.placement.stores) == 3
    await storage.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs the option 'shards'"),
        ({"shards": "memory://"}, "must be a list"),
        ({"shards": [3]}, "shard 1 is a int"),
        ({"shards": ["memory://", "memory://"]}, "same URL"),
        ({"shards": [], "names": ["a", "b"]}, "names has 2 entries but there are 1 shards"),
        ({"shards": [], "names": "a"}, "names must be a list"),
        ({"shards": [], "shard": []}, "unknown sharded option"),
        ({"shards": [], "colocate": 1}, "colocate must be a str"),
        ({"shards": [], "colocate": ""}, "colocate separator must not be empty"),
    ],
)
async def test_bad_options_are_refused_with_a_typed_error(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        await open_storage("memory://", decorators=[("sharded", options)])


async def test_a_shard_url_no_backend_serves_is_refused_and_nothing_stays_open() -> None:
    base = await open_storage("memory://")
    with pytest.raises(UnknownSchemeError, match="nosuch"):
        await ShardedDecorator().decorate(base, {"shards": ["memory://", "nosuch://x"]})
    assert not base.closed  # the caller still owns what it handed in


async def test_a_storage_given_twice_is_refused() -> None:
    base = await open_storage("memory://")
    with pytest.raises(InvalidOptionError, match="same Storage"):
        await ShardedDecorator().decorate(base, {"shards": [base]})


async def test_named_shards_route_by_name() -> None:
    one = [await open_storage("memory://") for _ in range(2)]
    two = [await open_storage("memory://") for _ in range(2)]
    first = sharded_storage(one, names=["east", "west"])
    swapped = sharded_storage(two[::-1], names=["west", "east"])
    for n in range(50):
        execution_id = f"order-{n}"
        a = events_of(first).shard_of(execution_id)
        b = events_of(swapped).shard_of(execution_id)
        assert ["east", "west"][a] == ["west", "east"][b]


async def test_closing_the_sharded_storage_closes_every_shard(shards: list[Storage]) -> None:
    await sharded_storage(shards).close()
    assert all(shard.closed for shard in shards)


async def test_the_kit_gets_two_extra_shards_of_the_kind_under_test() -> None:
    opened: list[Storage] = []

    async def open_inner() -> Storage:
        opened.append(await open_storage("memory://", options={"offer": ()}))
        return opened[-1]

    options = await ShardedDecorator().conformance_options(open_inner)
    assert options == {"shards": opened, "colocate": "-"}
    assert len(opened) == 2
