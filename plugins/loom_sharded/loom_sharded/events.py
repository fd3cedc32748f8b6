"""The sharded event store: each execution lives on the one shard its id hashes to."""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Sequence

from loom_core import Event, NewEvent
from loom_core.decorating import Decisions, EventStoreDecorator, Implement
from loom_core.errors import InvalidInputError, InvalidOptionError
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    MAX_POSITION,
    AppendRequest,
    ConditionalFence,
    EventStore,
    check_append,
    check_append_requests,
    check_execution_id,
    check_fence,
    check_key,
    check_limit,
    check_read,
    check_sequence,
)
from loom_sharded.errors import CrossShardError, Shard
from loom_sharded.layout import LAYOUT_ID
from loom_sharded.placement import Placement, on_shard
from loom_sharded.routing import ShardRouter

__all__ = ["ShardedEventStore"]


class ShardedEventStore(EventStoreDecorator):
    """Routes every per-execution call, the fencing ones included, to the owning shard.

    - ``list_executions`` asks every shard for its first ``limit`` ids after ``after`` and
      merges them: one code-point order, correct paging. It needs every shard: with one
      down it raises :class:`~loom_sharded.errors.ShardUnavailableError` rather than
      return a page with holes the next cursor would skip for good.
    - ``append_many`` is atomic only within one shard: a batch whose executions live on
      several shards is refused with :class:`~loom_sharded.errors.CrossShardError` before
      anything is written.
    - ``copy_prefix`` works when source and target live on the same shard, and a copy
      across shards is refused (``CrossShardError``): through the SPI it could be neither
      atomic nor exact (a truncated source, each event's fence stamp and ``recorded_at``
      cannot be re-created by appends).

    Every shard must offer the same optional methods (checked here), so ``capabilities``
    is true for every execution. :attr:`wrapped` is every shard's store in shard order, so
    whatever walks a stack (``find_layer``, ``find_layers``, ``loom_sqlite.backup``) sees
    all of them; ``inner`` is only shard 0, the store the decorator base's defaults would
    use (every method is routed here instead). :meth:`close` closes every shard.
    """

    def __init__(
        self,
        shards: Sequence[EventStore],
        *,
        router: ShardRouter | None = None,
        shard_info: Sequence[Shard] | None = None,
    ) -> None:
        if isinstance(shards, str) or not isinstance(shards, Sequence) or not shards:
            raise InvalidOptionError("ShardedEventStore needs a non-empty sequence of stores")
        router = router or ShardRouter([f"shard-{i}" for i in range(len(shards))])
        shard_info = shard_info or [Shard(i, n, "") for i, n in enumerate(router.names)]
        first = shards[0].capabilities
        for shard, store in zip(shard_info, shards, strict=True):
            if store.capabilities != first:
                differ = sorted(store.capabilities ^ first)
                raise InvalidOptionError(
                    f"every shard must offer the same optional methods, but {shard} differs "
                    f"from shard 0 in {differ}; a sharded store offers a method for every "
                    "execution or for none"
                )
        super().__init__(shards[0])
        self.placement: Placement[EventStore] = Placement(
            shards, router, shard_info, "the sharded event store"
        )

    def __repr__(self) -> str:
        return f"ShardedEventStore({len(self.placement.stores)} shards)"

    @property
    def wrapped(self) -> tuple[EventStore, ...]:
        """Every shard's event store, shard 0 first (the order of ``shard_of``)."""
        return self.placement.stores

    def shard_of(self, execution_id: str) -> int:
        """The index of the shard that owns ``execution_id``."""
        return self.placement.index_of(execution_id)

    # -- required -----------------------------------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        if self.placement.closed:
            # Bad input is refused as bad input, closed or not (checked here only when
            # closed: the shard checks it on the way through).
            check_append(execution_id, events, expected_sequence)
            if fence is not None:
                check_fence(fence)
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.append(
                execution_id, events, expected_sequence=expected_sequence, fence=fence
            )

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        if self.placement.closed:
            check_read(execution_id, from_sequence, to_sequence, limit)
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.read(
                execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
            )

    async def head(self, execution_id: str) -> int:
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.head(execution_id)

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        """Every shard's ids merged in ascending code-point order, strictly after ``after``.

        Each shard returns its own first ``limit`` ids after ``after``; the first ``limit``
        of the merge are the first ``limit`` overall, so paging with the last id of a page
        as the next ``after`` visits every id once.
        """
        if after is not None:
            after = check_key(after, "after")
        limit = check_limit(limit)
        # One more than the page, so a shard's page is still ``limit`` long without its
        # layout record (which is no execution, and is left out).
        pages = await self.placement.all(
            lambda store: store.list_executions(after=after, limit=min(limit + 1, MAX_POSITION))
        )
        merged: list[str] = []
        for execution_id in heapq.merge(
            *([i for i in page if i != LAYOUT_ID][:limit] for page in pages)
        ):
            # An id found on two shards (a copy left behind by a migration) is listed once.
            if merged and merged[-1] == execution_id:
                continue
            merged.append(execution_id)
            if len(merged) == limit:
                break
        return tuple(merged)

    async def close(self) -> None:
        await self.placement.close_all(lambda store: store.close())

    # -- optional: routed to the owning shard, offered when the shards offer them --------

    async def acquire_fence(self, execution_id: str) -> int:
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.acquire_fence(execution_id)

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        fence = check_fence(fence)
        park_seq = check_sequence(park_seq, "park_seq")
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.acquire_fence_if(execution_id, fence=fence, park_seq=park_seq)

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        if self.placement.closed:
            check_append(execution_id, events, expected_sequence)
            check_fence(observed_fence, "observed_fence")
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.append_if_unchanged(
                execution_id, events, expected_sequence=expected_sequence,
                observed_fence=observed_fence,
            )

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        """One shard's ``append_many``; a batch spanning shards is refused, unwritten."""
        checked = check_append_requests(requests)
        placement = {r.execution_id: self.placement.index_of(r.execution_id) for r, _ in checked}
        owners = set(placement.values())
        if len(owners) > 1:
            raise CrossShardError(
                "append_many",
                placement,
                "append_many is atomic only within one shard; send each shard's part as its "
                "own append_many (ShardedEventStore.shard_of tells the shard), accepting that "
                "the parts are not atomic together",
            )
        index = owners.pop()
        with on_shard(self.placement.shards[index], checked[0][0].execution_id):
            return await self.placement.stores[index].append_many([r for r, _ in checked])

    async def delete_execution(self, execution_id: str) -> bool:
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.delete_execution(execution_id)

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        """Copy within the owning shard; a source and target on different shards are
        refused (see the class docstring for why)."""
        source = check_key(source, "source")
        target = check_execution_id(target)
        through_sequence = check_sequence(through_sequence, "through_sequence")
        if source == target:
            raise InvalidInputError(f"copy_prefix source and target are both {source!r}")
        source, store, shard = self.placement.route(source, "source")
        target_index = self.placement.index_of(target)
        if target_index != shard.index:
            raise CrossShardError(
                "copy_prefix",
                {source: shard.index, target: target_index},
                "a copy across shards can be neither atomic nor exact (a truncated source's "
                "sequences, each event's fence stamp and recorded_at cannot be re-created by "
                "appends), so it is refused; choose a target id on the source's shard "
                "(ShardedEventStore.shard_of)",
            )
        with on_shard(shard, source):
            return await store.copy_prefix(source, target, through_sequence=through_sequence)

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        keep_from_sequence = check_sequence(keep_from_sequence, "keep_from_sequence")
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.truncate_prefix_keeping(
                execution_id, keep_from_sequence=keep_from_sequence
            )

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        """The owning shard's subscription, opened (and validated) eagerly."""
        from_sequence = check_sequence(from_sequence, "from_sequence")
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            events = store.subscribe(execution_id, from_sequence=from_sequence)
        return _follow(events, shard, execution_id)

    decisions = Decisions(
        acquire_fence=Implement(acquire_fence),
        acquire_fence_if=Implement(acquire_fence_if),
        append_if_unchanged=Implement(append_if_unchanged),
        append_many=Implement(append_many),
        delete_execution=Implement(delete_execution),
        copy_prefix=Implement(copy_prefix),
        truncate_prefix_keeping=Implement(truncate_prefix_keeping),
        subscribe=Implement(subscribe),
    )


async def _follow(
    events: AsyncIterator[Event], shard: Shard, execution_id: str
) -> AsyncIterator[Event]:
    try:
        with on_shard(shard, execution_id):
            async for event in events:
                yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
