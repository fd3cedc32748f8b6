"""The conformance kit again through ``sharded``, with plain routing (no ``colocate``).

Here the kit's ids spread over three shards, so its listing, timer and lease cases see
ids on every shard. Some of its cases put executions that now live on different shards
into one ``append_many`` or ``copy_prefix`` call, which the sharded store refuses by
design (docs/sharded.md). Those are replaced below by the same scenario asserting the
refusal: ``CrossShardError`` naming the placement, and nothing written. Of the refusals
the kit compares the whole store around, the four in :data:`SPANNING` span shards here,
so they are refused for that (still changing nothing) before the shard could refuse them.
"""

import dataclasses
from collections.abc import Awaitable, Callable

import pytest
from loom_conformance import StorageFactory
from loom_conformance import suites as kit
from loom_conformance.requirements import requires
from loom_conformance.suites.events_refusals import REFUSALS, Refusal
from loom_sharded import CrossShardError, sharded_storage

from loom_core import AppendRequest, EventStore, NewEvent, Storage, open_storage
from loom_core.spi import OptionalMethod

OFFERS: dict[str, tuple[OptionalMethod, ...] | None] = {"full": None, "bare": ()}
SPANNING = frozenset({
    # exec-new routes to shard 0; exec-fenced, exec-parked and exec-copy to shard 1.
    "append-many-conflict-in-a-later-request",
    "append-many-stale-token-in-a-later-request",
    "copy-prefix-past-the-head",
    "copy-prefix-of-no-log",
})


@pytest.fixture(params=sorted(OFFERS), ids=lambda kind: f"sharded-spread-over-{kind}-memory")
def loom_storage_factory(request: pytest.FixtureRequest) -> StorageFactory:
    offer = OFFERS[request.param]
    options: dict[str, object] = {} if offer is None else {"offer": offer}

    async def open_spread() -> Storage:
        return sharded_storage([await open_storage("memory://", options=options)
                                for _ in range(3)])

    return open_spread


async def snapshot(store: EventStore, *ids: str) -> tuple[object, ...]:
    """Every listed execution and ``ids``, with heads and logs."""
    listed = await store.list_executions(limit=1000)
    every = sorted({*listed, *ids})
    return (listed, [await store.head(i) for i in every], [await store.read(i) for i in every])


async def refused_unwritten(
    store: EventStore, call: Callable[[], Awaitable[object]], placement: dict[str, int]
) -> None:
    before = await snapshot(store, *placement)
    with pytest.raises(CrossShardError) as refused:
        await call()
    assert refused.value.placement == placement
    assert await snapshot(store, *placement) == before


def app() -> NewEvent:
    return NewEvent("order.placed")


class TestShardedSpreadEventStoreContract(kit.TestEventStoreContract):
    @requires.fencing
    @pytest.mark.parametrize("refusal", REFUSALS, ids=[r.name for r in REFUSALS])
    async def test_a_refused_write_leaves_the_whole_store_as_it_was(
        self, loom_events: EventStore, refusal: Refusal
    ) -> None:
        if refusal.name in SPANNING:
            refusal = dataclasses.replace(refusal, error=CrossShardError)
        await super().test_a_refused_write_leaves_the_whole_store_as_it_was(
            loom_events, refusal
        )

    @requires.append_many
    @requires.fencing
    async def test_append_many_refuses_a_token_never_issued_and_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-a", [app()], expected_sequence=0)
        token = await loom_events.acquire_fence("exec-a")
        await refused_unwritten(
            loom_events,
            lambda: loom_events.append_many([
                AppendRequest("exec-b", [app()], 0),
                AppendRequest("exec-a", [app()], 1, fence=token + 3),
            ]),
            {"exec-a": 0, "exec-b": 1},
        )

    @requires.append_many
    async def test_append_many_writes_every_request_and_returns_them_in_order(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-b", [app()], expected_sequence=0)
        await refused_unwritten(
            loom_events,
            lambda: loom_events.append_many(
                [AppendRequest("exec-a", [app()], 0), AppendRequest("exec-b", [app()], 1)]
            ),
            {"exec-a": 0, "exec-b": 1},
        )

    @requires.append_many
    async def test_append_many_with_one_conflicting_request_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-b", [app(), app()], expected_sequence=0)
        await refused_unwritten(
            loom_events,
            lambda: loom_events.append_many(
                [
                    AppendRequest("exec-a", [app()], 0),
                    AppendRequest("exec-b", [app()], 1),
                    AppendRequest("exec-c", [app()], 0),
                ]
            ),
            {"exec-a": 0, "exec-b": 1, "exec-c": 2},
        )

    @requires.append_many
    async def test_append_many_with_one_stale_fence_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-b", [app()], expected_sequence=0)
        await refused_unwritten(
            loom_events,
            lambda: loom_events.append_many(
                [AppendRequest("exec-a", [app()], 0, fence=0),
                 AppendRequest("exec-b", [app()], 1, fence=0)]
            ),
            {"exec-a": 0, "exec-b": 1},
        )

    @requires.append_many
    @requires.fencing
    async def test_append_many_is_refused_with_its_first_refused_request(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-a", [app()], expected_sequence=0)
        await loom_events.append("exec-b", [app()], expected_sequence=0)
        await refused_unwritten(
            loom_events,
            lambda: loom_events.append_many(
                [AppendRequest("exec-b", [app()], 1, fence=0),
                 AppendRequest("exec-a", [app()], 3)]
            ),
            {"exec-a": 0, "exec-b": 1},
        )

    @requires.copy_prefix
    async def test_copy_prefix_branches_a_new_execution(self, loom_events: EventStore) -> None:
        await loom_events.append("exec-src", [app(), app()], expected_sequence=0)
        assert await loom_events.copy_prefix("exec-src", "exec-branch", through_sequence=1) == 2
        await refused_unwritten(
            loom_events,
            lambda: loom_events.copy_prefix("exec-src", "exec-short", through_sequence=1),
            {"exec-src": 0, "exec-short": 1},
        )

    @requires.copy_prefix
    @requires.truncate_prefix_keeping
    async def test_a_copy_of_a_truncated_prefix_ends_where_it_was_asked_to(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-t", [app() for _ in range(4)], expected_sequence=0)
        assert await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=2) == 2
        await refused_unwritten(
            loom_events,
            lambda: loom_events.copy_prefix("exec-t", "exec-none-left", through_sequence=0),
            {"exec-t": 2, "exec-none-left": 1},
        )

    @requires.copy_prefix
    async def test_concurrent_copies_to_one_target_have_exactly_one_winner(
        self, loom_events: EventStore
    ) -> None:
        # The race itself runs in test_sharded_conformance.py, where the kit's ids share a
        # shard; here the two copies' sources live on shards 0 and 1 and the target on 2.
        await loom_events.append("exec-a", [app(), app()], expected_sequence=0)
        await loom_events.append("exec-b", [app(), app(), app()], expected_sequence=0)
        for source, placement in (
            ("exec-a", {"exec-a": 0, "exec-copy-2": 2}),
            ("exec-b", {"exec-b": 1, "exec-copy-2": 2}),
        ):
            await refused_unwritten(
                loom_events,
                lambda source=source: loom_events.copy_prefix(  # type: ignore[misc]
                    source, "exec-copy-2", through_sequence=1
                ),
                placement,
            )

    @requires.copy_prefix
    async def test_copy_prefix_refusals_change_nothing(self, loom_events: EventStore) -> None:
        await loom_events.append("exec-src", [app(), app()], expected_sequence=0)
        await loom_events.append("exec-taken", [app()], expected_sequence=0)
        await refused_unwritten(
            loom_events,
            lambda: loom_events.copy_prefix("exec-src", "exec-taken", through_sequence=0),
            {"exec-src": 0, "exec-taken": 2},
        )


class TestShardedSpreadTimerStoreContract(kit.TestTimerStoreContract):
    pass


class TestShardedSpreadLeaseStoreContract(kit.TestLeaseStoreContract):
    pass
