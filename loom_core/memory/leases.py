"""In-memory lease store: scope ``process``, expiry by the store's (injectable) clock."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from loom_core.errors import LeaseHeldError, LeaseNotHeldError, StoreClosedError
from loom_core.memory.turns import YIELD_EVERY, one_turn
from loom_core.protocols import Lease, LeaseScope
from loom_core.validation import check_key, check_ttl

__all__ = ["MemoryLeaseStore"]


class MemoryLeaseStore:
    """Leases visible to this process only."""

    def __init__(self, *, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or (lambda: datetime.now(UTC))
        self._leases: dict[str, Lease] = {}
        self._closed = False
        self._turns = 1  # calls left until the next yield: the first call yields

    @property
    def scope(self) -> LeaseScope:
        return "process"

    def _live(self, key: str, now: datetime) -> Lease | None:
        lease = self._leases.get(key)
        if lease is not None and lease.expires_at <= now:
            del self._leases[key]
            return None
        return lease

    async def acquire(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl = check_ttl(ttl_seconds)
        await self._tick()
        now = self._clock()
        current = self._live(key, now)
        if current is not None and current.holder != holder:
            raise LeaseHeldError(key, current.holder, current.expires_at)
        acquired_at = current.acquired_at if current is not None else now
        lease = Lease(key, holder, acquired_at, now + timedelta(seconds=ttl))
        self._leases[key] = lease
        return lease

    async def renew(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl = check_ttl(ttl_seconds)
        await self._tick()
        now = self._clock()
        current = self._live(key, now)
        if current is None or current.holder != holder:
            raise LeaseNotHeldError(key, holder)
        lease = Lease(key, holder, current.acquired_at, now + timedelta(seconds=ttl))
        self._leases[key] = lease
        return lease

    async def release(self, key: str, holder: str) -> bool:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        await self._tick()
        current = self._live(key, self._clock())
        if current is None or current.holder != holder:
            return False
        del self._leases[key]
        return True

    async def inspect(self, key: str) -> Lease | None:
        key = check_key(key, "lease key")
        await self._tick()
        return self._live(key, self._clock())

    async def close(self) -> None:
        self._closed = True

    async def _tick(self) -> None:
        # A yield every YIELD_EVERY calls (loom_core.memory.turns). Closed is checked on
        # both sides of the yield, so a call that raced close() is refused too.
        if self._closed:
            raise StoreClosedError('this in-memory lease store')
        self._turns -= 1
        if not self._turns:
            self._turns = YIELD_EVERY
            await one_turn()
            if self._closed:
                raise StoreClosedError('this in-memory lease store')
