"""The sharded lease store: a lease lives on the shard its key hashes to."""

from __future__ import annotations

from loom_core.spi import Lease, LeaseScope, LeaseStore, check_key, check_ttl
from loom_sharded.placement import Placement, on_shard

__all__ = ["ShardedLeaseStore"]


class ShardedLeaseStore:
    """Every call goes to the shard that owns the key (the same hash as execution ids, so
    a lease keyed by an execution id lives beside that execution's log).

    ``scope`` is the shards' common scope, or ``"unknown"`` when they differ.
    """

    def __init__(self, placement: Placement[LeaseStore]) -> None:
        self.placement = placement

    @property
    def scope(self) -> LeaseScope:
        scopes = {store.scope for store in self.placement.stores}
        return scopes.pop() if len(scopes) == 1 else "unknown"

    async def acquire(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        holder = check_key(holder, "lease holder")
        ttl_seconds = check_ttl(ttl_seconds)
        key, store, shard = self.placement.route(key, "lease key")
        with on_shard(shard, key):
            return await store.acquire(key, holder, ttl_seconds=ttl_seconds)

    async def renew(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        holder = check_key(holder, "lease holder")
        ttl_seconds = check_ttl(ttl_seconds)
        key, store, shard = self.placement.route(key, "lease key")
        with on_shard(shard, key):
            return await store.renew(key, holder, ttl_seconds=ttl_seconds)

    async def release(self, key: str, holder: str) -> bool:
        holder = check_key(holder, "lease holder")
        key, store, shard = self.placement.route(key, "lease key")
        with on_shard(shard, key):
            return await store.release(key, holder)

    async def inspect(self, key: str) -> Lease | None:
        key, store, shard = self.placement.route(key, "lease key")
        with on_shard(shard, key):
            return await store.inspect(key)

    async def close(self) -> None:
        await self.placement.close_all(lambda store: store.close())

    def shard_of(self, key: str) -> int:
        return self.placement.index_of(key, "lease key")
