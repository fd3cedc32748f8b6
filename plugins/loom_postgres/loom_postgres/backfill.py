"""The park-fence backfill and the deploy-step :func:`migrate`.

Parks written before parks created their own token-0 fence row have no row for an
answering append to lock, so their first ``acquire_fence_if`` could race an answer (ADR
0118, "Implementation (as built)"). The backfill inserts the token-0 row of every
execution that is parked and unanswered now. It runs once, on the first boot, inside the
migration (one full scan of the events under the advisory lock). For a very large log
turn it off (``backfill_park_fences=False``), boot, and run :func:`backfill_park_fences`
offline: it builds a temporary partial index CONCURRENTLY, walks the parks in id order
in short batches (resumable: each batch is idempotent), records the same marker, and
drops the index (nothing scans parks by kind afterwards, so keeping it would only tax
every park append).
"""

from __future__ import annotations

from typing import Final

import psycopg

from loom_core.errors import InvalidOptionError
from loom_core.kinds import EventKind
from loom_postgres.database import Connection, configure_session
from loom_postgres.errors import SchemaMigrationError
from loom_postgres.options import PostgresOptions, parse_options
from loom_postgres.schema import (
    ANSWERING,
    BACKFILL_TASK,
    KERNEL,
    PARK_KIND,
    SCHEMA_VERSION,
    MigrationReport,
    migrate_connection,
    schema_state,
)
from loom_postgres.storage import check_url

__all__ = ["backfill_park_fences", "migrate"]

# The kind is the kernel's constant, written into the DDL because an index predicate
# cannot take a parameter; no caller value is ever formatted into SQL.
assert EventKind.EXECUTION_SUSPENDED.value == "EXECUTION_SUSPENDED"
PARK_INDEX: Final = """
CREATE INDEX CONCURRENTLY loom_events_parks ON loom_events (execution_id, sequence)
WHERE kind = 'EXECUTION_SUSPENDED'
"""
DROP_PARK_INDEX: Final = "DROP INDEX CONCURRENTLY IF EXISTS loom_events_parks"

NEXT_PARKED: Final = """
SELECT DISTINCT execution_id FROM loom_events
WHERE kind = 'EXECUTION_SUSPENDED' AND execution_id > %s
ORDER BY execution_id
LIMIT %s
"""

BACKFILL_BATCH: Final = """
INSERT INTO loom_fences (execution_id, token)
SELECT DISTINCT p.execution_id, 0
FROM loom_events p
WHERE p.execution_id = ANY (%(ids)s::text[])
  AND p.kind = %(park)s
  AND NOT EXISTS (
      SELECT 1 FROM loom_events a
      WHERE a.execution_id = p.execution_id
        AND a.sequence > p.sequence
        AND (a.kind = ANY (%(answering)s)
             OR (a.kind <> ALL (%(kernel)s)
                 AND (a.metadata::jsonb) -> 'kernel' = 'true'::jsonb)))
ON CONFLICT DO NOTHING
"""


async def _connect(url: str, options: PostgresOptions) -> Connection:
    conn = await psycopg.AsyncConnection.connect(
        check_url(url), autocommit=True, connect_timeout=max(1, round(options.connect_timeout))
    )
    await configure_session(conn, options)
    return conn


async def migrate(
    url: str,
    *,
    schema: str | None = None,
    backfill_park_fences: bool = True,
    lock_timeout: float = 10.0,
) -> MigrationReport:
    """Create or migrate the Loom schema at ``url`` (a deploy step; every store also does
    it on first connect). Safe to run from several processes at once: they serialise on
    an advisory lock and the later ones find nothing to do.

    Raises SchemaMigrationError when a table lock is not granted within ``lock_timeout``
    seconds (nothing changed; retry) or the role may not create the schema.
    """
    options = parse_options(
        {"schema": schema, "backfill_park_fences": backfill_park_fences,
         "migration_lock_timeout": lock_timeout}
    )
    conn = await _connect(url, options)
    try:
        return await migrate_connection(
            conn, schema=schema, backfill_park_fences=backfill_park_fences,
            lock_timeout=lock_timeout,
        )
    finally:
        await conn.close()


async def backfill_park_fences(
    url: str, *, schema: str | None = None, batch_size: int = 1000
) -> int:
    """The batched, offline park-fence backfill; returns the fence rows it inserted.

    Idempotent and resumable; a no-op once done (by this or by a boot). Refuses a
    database whose Loom schema is missing or behind (run :func:`migrate` first).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidOptionError(f"batch_size must be an int >= 1, got {batch_size!r}")
    options = parse_options({"schema": schema})
    conn = await _connect(url, options)
    try:
        version, done = await schema_state(conn)
        if version < SCHEMA_VERSION:
            raise SchemaMigrationError(
                f"the Loom schema is at version {version}; run migrate() before the backfill"
            )
        if done:
            return 0
        # An earlier run that died mid-build leaves an INVALID index behind; start over.
        await conn.execute(DROP_PARK_INDEX)
        await conn.execute(PARK_INDEX)
        total = 0
        after = ""
        while True:
            cur = await conn.execute(NEXT_PARKED, (after, batch_size))
            ids = [str(row[0]) for row in await cur.fetchall()]
            if not ids:
                break
            cur = await conn.execute(
                BACKFILL_BATCH,
                {"ids": ids, "park": PARK_KIND, "answering": ANSWERING, "kernel": KERNEL},
            )
            total += max(cur.rowcount, 0)
            after = ids[-1]
        await conn.execute(
            "INSERT INTO loom_maintenance (task) VALUES (%s) ON CONFLICT DO NOTHING",
            (BACKFILL_TASK,),
        )
        await conn.execute(DROP_PARK_INDEX)
        return total
    finally:
        await conn.close()
