"""The SQLite lease store: scope ``host``, expiry by the store clock, shared by processes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loom_core import InvalidOptionError, LeaseHeldError, LeaseNotHeldError, open_storage


class Clock:
    """A store clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def test_a_held_lease_refuses_others_until_it_expires(db_url: str) -> None:
    clock = Clock()
    async with open_storage(db_url, options={"clock": clock}) as storage:
        leases = storage.leases
        assert leases.scope == "host"
        lease = await leases.acquire("job", "node-a", ttl_seconds=10)
        assert lease.expires_at == clock.now + timedelta(seconds=10)
        with pytest.raises(LeaseHeldError) as caught:
            await leases.acquire("job", "node-b", ttl_seconds=10)
        assert caught.value.holder == "node-a"
        assert caught.value.expires_at == lease.expires_at
        clock.advance(10)  # expiry is inclusive: at expires_at the lease is gone
        assert await leases.inspect("job") is None
        taken = await leases.acquire("job", "node-b", ttl_seconds=5)
        assert taken.holder == "node-b"
        assert taken.acquired_at == clock.now


async def test_reacquiring_our_own_lease_extends_it_and_keeps_acquired_at(db_url: str) -> None:
    clock = Clock()
    async with open_storage(db_url, options={"clock": clock}) as storage:
        first = await storage.leases.acquire("job", "a", ttl_seconds=10)
        clock.advance(4)
        again = await storage.leases.acquire("job", "a", ttl_seconds=10)
        assert again.acquired_at == first.acquired_at
        assert again.expires_at == clock.now + timedelta(seconds=10)
        assert await storage.leases.inspect("job") == again


async def test_renew_and_release_need_the_holder_and_an_unexpired_lease(db_url: str) -> None:
    clock = Clock()
    async with open_storage(db_url, options={"clock": clock}) as storage:
        leases = storage.leases
        await leases.acquire("job", "a", ttl_seconds=10)
        with pytest.raises(LeaseNotHeldError):
            await leases.renew("job", "b", ttl_seconds=10)
        clock.advance(5)
        renewed = await leases.renew("job", "a", ttl_seconds=10)
        assert renewed.expires_at == clock.now + timedelta(seconds=10)
        assert await leases.release("job", "b") is False
        assert await leases.release("job", "a") is True
        assert await leases.release("job", "a") is False
        await leases.acquire("job", "a", ttl_seconds=1)
        clock.advance(2)
        with pytest.raises(LeaseNotHeldError):
            await leases.renew("job", "a", ttl_seconds=10)
        assert await leases.release("job", "a") is False


async def test_two_storages_on_one_file_share_leases(db_url: str) -> None:
    async with open_storage(db_url) as one, open_storage(db_url) as other:
        await one.leases.acquire("job", "node-a", ttl_seconds=60)
        with pytest.raises(LeaseHeldError):
            await other.leases.acquire("job", "node-b", ttl_seconds=60)
        inspected = await other.leases.inspect("job")
        assert inspected is not None
        assert inspected.holder == "node-a"


async def test_a_ttl_past_the_calendar_is_refused_and_changes_nothing(db_url: str) -> None:
    async with open_storage(db_url) as storage:
        with pytest.raises(InvalidOptionError, match="more than a year"):
            await storage.leases.acquire("job", "a", ttl_seconds=1e300)
        assert await storage.leases.inspect("job") is None
