"""The SQLite lease store: scope ``host``, expiry by the store's clock.

Every process that opens the same file sees the same leases, so the scope is ``host``
(lease evidence holds only among nodes sharing the store). Expiry is
decided by the store clock (:mod:`loom_sqlite.clock`: the host clock unless a ``clock``
option was given), read inside the same ``BEGIN IMMEDIATE`` transaction that checks and
writes the row, so two processes racing for a lease are ordered by SQLite's write lock
and judge expiry against one clock. A clock step forward of more than a lease's TTL
expires live leases early; the fence, not the lease, is what guards the log.
"""

from __future__ import annotations

import functools
import sqlite3
from datetime import UTC, datetime
from typing import Final

from loom_core.errors import InvalidOptionError, LeaseHeldError, LeaseNotHeldError
from loom_core.spi import Lease, LeaseScope, check_key, check_ttl
from loom_sqlite.clock import from_micros, host_clock, now_micros, to_micros
from loom_sqlite.errors import DatabaseClosedError
from loom_sqlite.settings import Clock
from loom_sqlite.transactions import TransactionRunner

__all__ = ["SqliteLeaseStore"]

SELECT_LEASE: Final = """
SELECT holder, acquired_at, expires_at FROM loom_leases WHERE lease_key = ?
"""
UPSERT_LEASE: Final = """
INSERT INTO loom_leases (lease_key, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?)
ON CONFLICT (lease_key) DO UPDATE SET
    holder = excluded.holder,
    acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at
"""
DELETE_LEASE: Final = "DELETE FROM loom_leases WHERE lease_key = ?"
_LATEST: Final = to_micros(datetime.max.replace(tzinfo=UTC))


def _live(raw: sqlite3.Connection, key: str, now: int) -> tuple[str, int, int] | None:
    row = raw.execute(SELECT_LEASE, (key,)).fetchone()
    if row is None or row[2] <= now:
        return None
    return str(row[0]), int(row[1]), int(row[2])


def _lease(key: str, holder: str, acquired_at: int, expires_at: int) -> Lease:
    return Lease(key, holder, from_micros(acquired_at), from_micros(expires_at))


def _expiry(now: int, ttl: int) -> int:
    if now + ttl > _LATEST:
        raise InvalidOptionError(
            f"ttl_seconds {ttl / 1_000_000:g} puts the lease's expiry past the year 9999"
        )
    return now + ttl


def _acquire(raw: sqlite3.Connection, key: str, holder: str, ttl: int, clock: Clock) -> Lease:
    now = now_micros(clock)
    expires_at = _expiry(now, ttl)
    current = _live(raw, key, now)
    if current is not None and current[0] != holder:
        raise LeaseHeldError(key, current[0], from_micros(current[2]))
    acquired_at = current[1] if current is not None else now
    raw.execute(UPSERT_LEASE, (key, holder, acquired_at, expires_at))
    return _lease(key, holder, acquired_at, expires_at)


def _renew(raw: sqlite3.Connection, key: str, holder: str, ttl: int, clock: Clock) -> Lease:
    now = now_micros(clock)
    expires_at = _expiry(now, ttl)
    current = _live(raw, key, now)
    if current is None or current[0] != holder:
        raise LeaseNotHeldError(key, holder)
    raw.execute(UPSERT_LEASE, (key, holder, current[1], expires_at))
    return _lease(key, holder, current[1], expires_at)


def _release(raw: sqlite3.Connection, key: str, holder: str, clock: Clock) -> bool:
    current = _live(raw, key, now_micros(clock))
    if current is None or current[0] != holder:
        return False
    raw.execute(DELETE_LEASE, (key,))
    return True


def _inspect(raw: sqlite3.Connection, key: str, clock: Clock) -> Lease | None:
    current = _live(raw, key, now_micros(clock))
    return None if current is None else _lease(key, *current)


class SqliteLeaseStore:
    """Leases in the storage's SQLite file, shared by every process on the host."""

    def __init__(self, runner: TransactionRunner, clock: Clock | None) -> None:
        self._runner = runner
        self._clock: Clock = clock or host_clock
        self._closed = False

    @property
    def scope(self) -> LeaseScope:
        return "host"

    def _open(self) -> TransactionRunner:
        if self._closed:
            raise DatabaseClosedError(self._runner.path)
        return self._runner

    async def acquire(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl = round(check_ttl(ttl_seconds) * 1_000_000)
        return await self._open().write(
            functools.partial(_acquire, key=key, holder=holder, ttl=ttl, clock=self._clock),
            doing=f"acquiring lease {key!r}",
        )

    async def renew(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl = round(check_ttl(ttl_seconds) * 1_000_000)
        return await self._open().write(
            functools.partial(_renew, key=key, holder=holder, ttl=ttl, clock=self._clock),
            doing=f"renewing lease {key!r}",
        )

    async def release(self, key: str, holder: str) -> bool:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        return await self._open().write(
            functools.partial(_release, key=key, holder=holder, clock=self._clock),
            doing=f"releasing lease {key!r}",
        )

    async def inspect(self, key: str) -> Lease | None:
        key = check_key(key, "lease key")
        return await self._open().read(
            functools.partial(_inspect, key=key, clock=self._clock),
            doing=f"inspecting lease {key!r}",
        )

    async def close(self) -> None:
        self._closed = True
