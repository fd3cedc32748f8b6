"""``TestLeaseStoreContract``: time-bounded ownership, expiry by the store's clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Final, get_args

import pytest

from loom_conformance.suites._support import GUARD_SECONDS, assert_refused_alike_when_closed
from loom_core import (
    InvalidExecutionIdError,
    InvalidOptionError,
    Lease,
    LeaseError,
    LeaseHeldError,
    LeaseNotHeldError,
    LeaseScope,
    LeaseStore,
    StoreClosedError,
)

__all__ = ["TestLeaseStoreContract"]

LONG: Final = 300.0
SHORT: Final = 0.05
"""A TTL short enough to wait out; expiry is observed by polling the store, never timed."""


async def _until_expired(leases: LeaseStore, key: str) -> None:
    """Poll until the store itself says the lease is gone (its clock decides)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_SECONDS
    while await leases.inspect(key) is not None:
        assert loop.time() < deadline, f"lease {key!r} with a {SHORT}s TTL never expired"
        await asyncio.sleep(SHORT / 2)


class TestLeaseStoreContract:
    """acquire / renew / release / inspect and a declared scope."""

    pytestmark = pytest.mark.asyncio(loop_scope="function")

    async def test_scope_is_declared(self, loom_leases: LeaseStore) -> None:
        assert loom_leases.scope in get_args(LeaseScope)

    async def test_acquire_then_inspect(self, loom_leases: LeaseStore) -> None:
        lease = await loom_leases.acquire("job-1", "node-a", ttl_seconds=LONG)
        assert lease.key == "job-1"
        assert lease.holder == "node-a"
        assert lease.expires_at > lease.acquired_at
        assert lease.acquired_at.utcoffset() is not None, "lease times are timezone-aware"
        assert await loom_leases.inspect("job-1") == lease
        assert await loom_leases.inspect("job-2") is None

    async def test_lease_held_by_another_is_refused_with_the_holder(
        self, loom_leases: LeaseStore
    ) -> None:
        held = await loom_leases.acquire("job-1", "node-a", ttl_seconds=LONG)
        with pytest.raises(LeaseHeldError) as caught:
            await loom_leases.acquire("job-1", "node-b", ttl_seconds=LONG)
        assert caught.value.holder == "node-a"
        assert caught.value.key == "job-1"
        assert caught.value.expires_at == held.expires_at
        assert isinstance(caught.value, LeaseError)
        assert await loom_leases.inspect("job-1") == held

    async def test_acquire_by_the_holder_extends_the_lease(
        self, loom_leases: LeaseStore
    ) -> None:
        first = await loom_leases.acquire("job-1", "node-a", ttl_seconds=10)
        again = await loom_leases.acquire("job-1", "node-a", ttl_seconds=LONG)
        assert again.holder == "node-a"
        assert again.expires_at > first.expires_at
        assert again.acquired_at == first.acquired_at, "an extension keeps acquired_at"
        assert await loom_leases.inspect("job-1") == again

    async def test_renew_extends_only_the_holders_lease(self, loom_leases: LeaseStore) -> None:
        first = await loom_leases.acquire("job-1", "node-a", ttl_seconds=10)
        renewed = await loom_leases.renew("job-1", "node-a", ttl_seconds=LONG)
        assert renewed.holder == "node-a"
        assert renewed.expires_at > first.expires_at
        assert renewed.acquired_at == first.acquired_at, "a renewal keeps acquired_at"
        with pytest.raises(LeaseNotHeldError) as caught:
            await loom_leases.renew("job-1", "node-b", ttl_seconds=LONG)
        assert caught.value.holder == "node-b"
        assert caught.value.key == "job-1"
        with pytest.raises(LeaseNotHeldError):
            await loom_leases.renew("job-free", "node-a", ttl_seconds=LONG)
        assert await loom_leases.inspect("job-1") == renewed

    async def test_release_frees_the_lease_for_others(self, loom_leases: LeaseStore) -> None:
        await loom_leases.acquire("job-1", "node-a", ttl_seconds=LONG)
        assert await loom_leases.release("job-1", "node-b") is False
        assert await loom_leases.inspect("job-1") is not None
        assert await loom_leases.release("job-1", "node-a") is True
        assert await loom_leases.release("job-1", "node-a") is False
        assert await loom_leases.inspect("job-1") is None
        taken = await loom_leases.acquire("job-1", "node-b", ttl_seconds=LONG)
        assert taken.holder == "node-b"

    async def test_expired_lease_is_free_and_cannot_be_renewed(
        self, loom_leases: LeaseStore
    ) -> None:
        await loom_leases.acquire("job-1", "node-a", ttl_seconds=SHORT)
        await loom_leases.acquire("job-keep", "node-a", ttl_seconds=LONG)
        await _until_expired(loom_leases, "job-1")

        with pytest.raises(LeaseNotHeldError):
            await loom_leases.renew("job-1", "node-a", ttl_seconds=LONG)
        assert await loom_leases.release("job-1", "node-a") is False
        taken = await loom_leases.acquire("job-1", "node-b", ttl_seconds=LONG)
        assert taken.holder == "node-b"
        kept = await loom_leases.inspect("job-keep")
        assert isinstance(kept, Lease)
        assert kept.holder == "node-a"

    async def test_a_lease_expires_exactly_its_ttl_after_it_was_acquired(
        self, loom_leases: LeaseStore
    ) -> None:
        """``expires_at`` is the store's time of the acquire plus ``ttl_seconds``, to the
        microsecond: not rounded to whole seconds or milliseconds."""
        for i, ttl in enumerate((0.25, 1.5, 2.000001)):
            lease = await loom_leases.acquire(f"job-{i}", "node-a", ttl_seconds=ttl)
            lasts = lease.expires_at - lease.acquired_at
            assert lasts == timedelta(seconds=ttl), (
                f"a lease acquired with ttl_seconds={ttl} lasts {lasts.total_seconds()} s "
                f"(acquired_at {lease.acquired_at.isoformat()}, expires_at "
                f"{lease.expires_at.isoformat()}): expires_at is the acquire's time plus the "
                "ttl, to the microsecond, never rounded"
            )

    @pytest.mark.parametrize("taker", ["node-b", "node-a"], ids=["another-holder", "same-holder"])
    async def test_taking_an_expired_lease_sets_acquired_at_anew(
        self, loom_leases: LeaseStore, taker: str
    ) -> None:
        """An expired lease is gone: whoever acquires it next, its old holder included,
        gets a new lease whose ``acquired_at`` is the time of that acquire."""
        first = await loom_leases.acquire("job-1", "node-a", ttl_seconds=SHORT)
        await _until_expired(loom_leases, "job-1")

        taken = await loom_leases.acquire("job-1", taker, ttl_seconds=LONG)
        assert taken.acquired_at >= first.expires_at, (
            f"{taker} took job-1 after node-a's lease expired at "
            f"{first.expires_at.isoformat()}, but the new lease's acquired_at is "
            f"{taken.acquired_at.isoformat()}: acquiring an expired lease starts a new one, "
            "acquired now (only an extension of a live lease keeps acquired_at)"
        )
        assert taken.expires_at - taken.acquired_at == timedelta(seconds=LONG)
        assert await loom_leases.inspect("job-1") == taken

    async def test_concurrent_acquires_have_exactly_one_holder(
        self, loom_leases: LeaseStore
    ) -> None:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(loom_leases.acquire("job-1", f"node-{i}", ttl_seconds=LONG) for i in range(8)),
                return_exceptions=True,
            ),
            GUARD_SECONDS,
        )
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1, results
        assert all(isinstance(r, LeaseHeldError) for r in results if not isinstance(r, Lease))
        assert await loom_leases.inspect("job-1") == winners[0]

    async def test_bad_lease_input_is_refused(self, loom_leases: LeaseStore) -> None:
        for key in ("", "nul\x00key", 7):
            k: Any = key
            with pytest.raises(InvalidExecutionIdError):
                await loom_leases.acquire(k, "node-a", ttl_seconds=LONG)
            with pytest.raises(InvalidExecutionIdError):
                await loom_leases.acquire("job-1", k, ttl_seconds=LONG)
            with pytest.raises(InvalidExecutionIdError):
                await loom_leases.inspect(k)
        for ttl in (0, -1, float("inf"), float("nan"), True, "10"):
            t: Any = ttl
            with pytest.raises(InvalidOptionError):
                await loom_leases.acquire("job-1", "node-a", ttl_seconds=t)
        assert await loom_leases.inspect("job-1") is None

    async def test_close_is_idempotent(self, loom_leases: LeaseStore) -> None:
        await loom_leases.close()
        await loom_leases.close()

    async def test_bad_input_on_a_closed_store_is_refused_as_bad_input(
        self, loom_leases: LeaseStore
    ) -> None:
        """Arguments are checked before the store is: a bad argument raises the same
        InvalidInputError on a closed store as on an open one, never StoreClosedError."""
        calls: tuple[tuple[str, Callable[[], Awaitable[object]]], ...] = (
            ("acquire, empty key", lambda: loom_leases.acquire("", "node-a", ttl_seconds=LONG)),
            ("acquire, empty holder", lambda: loom_leases.acquire("job-1", "", ttl_seconds=LONG)),
            ("acquire, ttl 0", lambda: loom_leases.acquire("job-1", "node-a", ttl_seconds=0)),
            ("renew, empty key", lambda: loom_leases.renew("", "node-a", ttl_seconds=LONG)),
            ("renew, ttl -1", lambda: loom_leases.renew("job-1", "node-a", ttl_seconds=-1)),
            ("release, empty holder", lambda: loom_leases.release("job-1", "")),
            ("inspect, empty key", lambda: loom_leases.inspect("")),
        )
        await assert_refused_alike_when_closed(calls, loom_leases.close, "lease store")

    async def test_every_method_after_close_raises_store_closed(
        self, loom_leases: LeaseStore
    ) -> None:
        await loom_leases.acquire("job-1", "node-a", ttl_seconds=LONG)
        await loom_leases.close()
        calls: tuple[Callable[[], Awaitable[object]], ...] = (
            lambda: loom_leases.acquire("job-2", "node-a", ttl_seconds=LONG),
            lambda: loom_leases.renew("job-1", "node-a", ttl_seconds=LONG),
            lambda: loom_leases.release("job-1", "node-a"),
            lambda: loom_leases.inspect("job-1"),
        )
        for call in calls:
            with pytest.raises(StoreClosedError):
                await call()
