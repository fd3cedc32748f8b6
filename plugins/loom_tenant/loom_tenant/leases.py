"""The tenant-scoped lease store."""

from __future__ import annotations

from contextlib import AbstractContextManager

from loom_core.errors import StoreClosedError
from loom_core.spi import Lease, LeaseScope, LeaseStore, check_key, check_ttl
from loom_tenant.codec import TenantCodec
from loom_tenant.scrubbing import tenant_errors

__all__ = ["TenantLeaseStore"]


class TenantLeaseStore:
    """One tenant's leases in a shared inner :class:`~loom_core.spi.LeaseStore`.

    Keys are encoded like execution ids, so a tenant can neither take nor see another
    tenant's lease of the same key. Holders are not encoded: a holder names a node, and a
    lease is found by its key only.
    """

    def __init__(self, inner: LeaseStore, tenant: str, *, owns_inner: bool = True) -> None:
        self.inner = inner
        self.codec = TenantCodec(tenant)
        self._owns_inner = owns_inner
        self._closed = False

    @property
    def tenant(self) -> str:
        return self.codec.tenant

    @property
    def scope(self) -> LeaseScope:
        return self.inner.scope

    def _restore(self, lease: Lease, key: str) -> Lease:
        return Lease(key, lease.holder, lease.acquired_at, lease.expires_at)

    async def acquire(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        stored = self.codec.encode(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl_seconds = check_ttl(ttl_seconds)
        with self._errors(key):
            lease = await self.inner.acquire(stored, holder, ttl_seconds=ttl_seconds)
        return self._restore(lease, key)

    async def renew(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        stored = self.codec.encode(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl_seconds = check_ttl(ttl_seconds)
        with self._errors(key):
            lease = await self.inner.renew(stored, holder, ttl_seconds=ttl_seconds)
        return self._restore(lease, key)

    async def release(self, key: str, holder: str) -> bool:
        stored = self.codec.encode(key, "lease key")
        holder = check_key(holder, "lease holder")
        with self._errors(key):
            return await self.inner.release(stored, holder)

    async def inspect(self, key: str) -> Lease | None:
        stored = self.codec.encode(key, "lease key")
        with self._errors(key):
            lease = await self.inner.inspect(stored)
        return None if lease is None else self._restore(lease, key)

    async def close(self) -> None:
        """Refuse every later call; close the inner store too if this view owns it."""
        if self._closed:
            return
        self._closed = True
        if self._owns_inner:
            await self.inner.close()

    def _errors(self, *raw_ids: str) -> AbstractContextManager[None]:
        """The scrubbing scope of one call to the inner store, once it is known to be open:
        a closed view refuses even while the store it shares stays open for others."""
        if self._closed:
            raise StoreClosedError(f"tenant {self.tenant!r}'s view of the lease store")
        return tenant_errors(self.codec, *raw_ids)
