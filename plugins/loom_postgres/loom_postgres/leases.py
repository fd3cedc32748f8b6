"""The PostgreSQL lease store: scope ``cluster`` (every node that shares the database sees
the same leases), expiry decided by the database's clock, never a node's."""

from __future__ import annotations

from datetime import datetime
from typing import Final, cast

from loom_core.errors import LeaseHeldError, LeaseNotHeldError, StoreClosedError
from loom_core.spi import Lease, LeaseScope, check_key, check_ttl
from loom_postgres.database import Database

__all__ = ["PostgresLeaseStore"]

# Free, expired, or already ours (then extended, keeping acquired_at): one statement,
# so two nodes racing for a free lease cannot both win.
ACQUIRE: Final = """
INSERT INTO loom_leases AS l (key, holder, acquired_at, expires_at)
VALUES (%(key)s, %(holder)s, statement_timestamp(),
        statement_timestamp() + make_interval(secs => %(ttl)s))
ON CONFLICT (key) DO UPDATE SET
    holder = EXCLUDED.holder,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > statement_timestamp()
                       THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
    expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= statement_timestamp()
RETURNING holder, acquired_at, expires_at
"""

HOLDER: Final = """
SELECT holder, acquired_at, expires_at FROM loom_leases
WHERE key = %s AND expires_at > statement_timestamp()
"""

RENEW: Final = """
UPDATE loom_leases
SET expires_at = statement_timestamp() + make_interval(secs => %s)
WHERE key = %s AND holder = %s AND expires_at > statement_timestamp()
RETURNING holder, acquired_at, expires_at
"""

RELEASE: Final = """
DELETE FROM loom_leases WHERE key = %s AND holder = %s
RETURNING expires_at > statement_timestamp()
"""


class PostgresLeaseStore:
    """Leases every node of the database sees."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._closed = False

    @property
    def scope(self) -> LeaseScope:
        return "cluster"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("this PostgreSQL lease store")

    @staticmethod
    def _lease(key: str, row: tuple[object, ...]) -> Lease:
        holder, acquired_at, expires_at = row
        return Lease(key, str(holder), cast(datetime, acquired_at), cast(datetime, expires_at))

    async def acquire(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl = check_ttl(ttl_seconds)
        self._check_open()
        for _ in range(3):
            rows = await self._db.fetch(
                ACQUIRE, {"key": key, "holder": holder, "ttl": ttl}, what="lease acquire",
                write=True,
            )
            if rows:
                return self._lease(key, rows[0])
            current = await self._db.fetch(HOLDER, (key,), what="lease inspect")
            if current:
                other = self._lease(key, current[0])
                raise LeaseHeldError(key, other.holder, other.expires_at)
            # It expired or was released between the two statements: try again.
        raise LeaseHeldError(key, "(contended)", datetime.now().astimezone())

    async def renew(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        ttl = check_ttl(ttl_seconds)
        self._check_open()
        rows = await self._db.fetch(RENEW, (ttl, key, holder), what="lease renew", write=True)
        if not rows:
            raise LeaseNotHeldError(key, holder)
        return self._lease(key, rows[0])

    async def release(self, key: str, holder: str) -> bool:
        key = check_key(key, "lease key")
        holder = check_key(holder, "lease holder")
        self._check_open()
        rows = await self._db.fetch(RELEASE, (key, holder), what="lease release", write=True)
        return bool(rows and rows[0][0])

    async def inspect(self, key: str) -> Lease | None:
        key = check_key(key, "lease key")
        self._check_open()
        rows = await self._db.fetch(HOLDER, (key,), what="lease inspect")
        return self._lease(key, rows[0]) if rows else None

    async def close(self) -> None:
        self._closed = True
