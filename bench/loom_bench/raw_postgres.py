"""The PostgreSQL raw floor: the same writes through bare psycopg, no Loom code.

One connection per concurrent execution (``concurrency`` of them, autocommit, psycopg's
automatic prepared statements), each append its own transaction, into an equivalent table
(primary key ``(execution_id, sequence)``) in the same database as the store under test.
The statements are the minimal ones the fence and the conditional acquire need (see
docs/design.md, "The conditional acquire"), written by hand:

- an append is one ``INSERT``; a park also creates the execution's token-0 fence row in
  the same statement, so a later answer can lock it;
- ``acquire_fence`` is an upsert that bumps the token;
- a fenced append inserts only while its token is current, reading the fence row
  ``FOR SHARE`` when the event answers a park;
- ``acquire_fence_if`` is one transaction: lock the fence row ``FOR UPDATE``, then bump it
  only if the token matches and no answering event exists past the park.

This is the plain-pool loop, measured at about 0.45x of pgbench on
these machines: no pipelining, no group commit. It is a floor, not a ceiling;
:mod:`loom_bench.pgbench` gives the ceiling.
"""

from __future__ import annotations

import json
from typing import Final

from loom_bench.drive import RunPlan, Tick, drive_workers
from loom_bench.scenarios import (
    PARK,
    AcquireFence,
    Append,
    Scenario,
    ScenarioError,
)
from loom_bench.statistics import Sample
from loom_core.spi import ANSWERING_KINDS, KERNEL_KINDS

try:
    import psycopg
except ImportError:  # pragma: no cover - reported by the runner as "needs psycopg"
    psycopg = None  # type: ignore[assignment]

__all__ = [
    "EVENTS_TABLE",
    "FENCES_TABLE",
    "SCHEMA",
    "available",
    "ensure_database",
    "measure_raw_postgres",
    "prepare_raw_postgres",
    "settle",
    "settle_database",
    "server_settings",
]

EVENTS_TABLE: Final = "bench_raw_events"
FENCES_TABLE: Final = "bench_raw_fences"

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS bench_raw_events (
        execution_id text NOT NULL,
        sequence integer NOT NULL,
        kind text NOT NULL,
        payload jsonb NOT NULL,
        metadata jsonb NOT NULL,
        recorded_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (execution_id, sequence)
    )""",
    """CREATE TABLE IF NOT EXISTS bench_raw_fences (
        execution_id text PRIMARY KEY,
        token bigint NOT NULL
    )""",
)
INSERT: Final = (
    "INSERT INTO bench_raw_events (execution_id, sequence, kind, payload, metadata) "
    "VALUES (%s, %s, %s, %s::jsonb, %s::jsonb)"
)
INSERT_PARK: Final = (
    "WITH fence AS (INSERT INTO bench_raw_fences (execution_id, token) VALUES (%s, 0) "
    "ON CONFLICT (execution_id) DO NOTHING) "
    "INSERT INTO bench_raw_events (execution_id, sequence, kind, payload, metadata) "
    "VALUES (%s, %s, %s, %s::jsonb, %s::jsonb)"
)
INSERT_FENCED: Final = (
    "INSERT INTO bench_raw_events (execution_id, sequence, kind, payload, metadata) "
    "SELECT %s, %s, %s, %s::jsonb, %s::jsonb WHERE COALESCE("
    "(SELECT token FROM bench_raw_fences WHERE execution_id = %s), 0) <= %s"
)
INSERT_FENCED_ANSWERING: Final = (
    "INSERT INTO bench_raw_events (execution_id, sequence, kind, payload, metadata) "
    "SELECT %s, %s, %s, %s::jsonb, %s::jsonb WHERE COALESCE("
    "(SELECT token FROM bench_raw_fences WHERE execution_id = %s FOR SHARE), 0) <= %s"
)
ACQUIRE: Final = (
    "INSERT INTO bench_raw_fences (execution_id, token) VALUES (%s, 1) "
    "ON CONFLICT (execution_id) DO UPDATE SET token = bench_raw_fences.token + 1 "
    "RETURNING token"
)
LOCK_FENCE: Final = "SELECT token FROM bench_raw_fences WHERE execution_id = %s FOR UPDATE"
ACQUIRE_IF: Final = (
    "UPDATE bench_raw_fences SET token = token + 1 "
    "WHERE execution_id = %s AND token = %s AND NOT EXISTS ("
    "SELECT 1 FROM bench_raw_events WHERE execution_id = %s AND sequence > %s AND ("
    "kind = ANY(%s) OR (kind <> ALL(%s) AND metadata -> 'kernel' = 'true'::jsonb))) "
    "RETURNING token"
)
_ANSWERING: Final = sorted(ANSWERING_KINDS)
_KERNEL: Final = sorted(KERNEL_KINDS)


def available() -> str | None:
    """None when psycopg is importable, else what to install."""
    if psycopg is None:
        return "the PostgreSQL raw floor needs psycopg: pip install 'loom-bench[postgres]'"
    return None


async def prepare_raw_postgres(url: str) -> None:
    """Create the floor's two tables (once per database; later runs append to them)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for statement in SCHEMA:
            await conn.execute(statement)


# The tables runs write into: our store's and the floor's (pgbench writes the floor's).
RUN_TABLES: Final = (
    "loom_events",
    "loom_executions",
    "loom_fences",
    EVENTS_TABLE,
    FENCES_TABLE,
)
# Only tables that hold something: VACUUM records an empty table as known to be empty,
# and the planner then reads its primary key lookups as sequential scans and keeps those
# plans while the next run fills it (measured: a first fenced run at a fifth of the rate
# of the others). A table never vacuumed is assumed to have ten pages and gets index scans.
TABLES_TO_VACUUM: Final = (
    "SELECT t.name FROM unnest(%s::text[]) AS t(name), "
    "LATERAL (SELECT to_regclass(quote_ident(current_schema()) || '.' || quote_ident(t.name)) "
    "AS oid) AS r "
    "WHERE r.oid IS NOT NULL AND pg_relation_size(r.oid) > 0 "
    "ORDER BY t.name"
)


async def settle(url: str) -> bool:
    """Vacuum the tables runs write into, then checkpoint, so the next run starts as this
    one did: no dead rows for autovacuum to clean up in the middle of it, no dirty buffers
    left over, and (the checkpoint restarts ``checkpoint_timeout``) no checkpoint inside
    its timed part. pgbench vacuums before its runs by default for the same reason.

    The tables keep their rows: plans and caches stay those of a store in use. Returns
    False when the role may not ``CHECKPOINT`` (the vacuum still ran)."""
    from psycopg import errors, sql

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(TABLES_TO_VACUUM, (list(RUN_TABLES),))
        names = [str(row[0]) for row in await cursor.fetchall()]
        if names:
            # Table names cannot be bind parameters; they are our constants, quoted.
            await conn.execute(
                sql.SQL("VACUUM {}").format(sql.SQL(", ").join(map(sql.Identifier, names)))
            )
        try:
            await conn.execute("CHECKPOINT")
        except errors.InsufficientPrivilege:
            return False
    return True


async def settle_database(url: str) -> None:
    """Vacuum every table of a peer's own database (it holds nothing else), as
    :func:`settle` does ours; the checkpoint that follows is :func:`settle`'s."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("VACUUM")


SETTINGS: Final = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "shared_buffers",
    "max_connections",
    "default_transaction_isolation",
)
# current_setting() formats a value with its unit as SHOW does ("64MB", not "8192 8kB").
SHOW_SETTINGS: Final = (
    "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name ORDER BY name"
)
DATABASE_EXISTS: Final = "SELECT 1 FROM pg_database WHERE datname = %s"


async def server_settings(url: str) -> dict[str, object]:
    """The server settings the figures depend on (durability above all)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(SHOW_SETTINGS, (list(SETTINGS),))
        rows = await cursor.fetchall()
    return {f"postgres_{name}": str(setting) for name, setting in rows}


async def ensure_database(url: str, name: str) -> None:
    """Create database ``name`` on the server at ``url`` unless it exists (the sharded
    stack's second shard). Needs the CREATEDB privilege."""
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(DATABASE_EXISTS, (name,))
        if await cursor.fetchone() is None:
            # A database name cannot be a bind parameter; Identifier quotes it safely.
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


async def _run_execution(
    conn: psycopg.AsyncConnection[tuple[int]], execution_id: str, scenario: Scenario
) -> None:
    sequence = 0
    token = scenario.held_token
    park_token, park_sequence = 0, -1
    for step in scenario.steps:
        if isinstance(step, Append):
            kind = step.event.kind
            payload = json.dumps(step.event.payload, separators=(",", ":"))
            if step.fenced and token is not None:
                statement = INSERT_FENCED_ANSWERING if kind in ANSWERING_KINDS else INSERT_FENCED
                cursor = await conn.execute(
                    statement,
                    (execution_id, sequence, kind, payload, json.dumps({"fence": token}),
                     execution_id, token),
                    prepare=True,
                )
                if cursor.rowcount != 1:
                    raise ScenarioError(f"raw fenced append of {execution_id!r} refused")
                if kind == PARK.kind:
                    park_token, park_sequence = token, sequence
            elif kind == PARK.kind:
                await conn.execute(
                    INSERT_PARK,
                    (execution_id, execution_id, sequence, kind, payload, "{}"),
                    prepare=True,
                )
                park_token, park_sequence = 0, sequence
            else:
                await conn.execute(
                    INSERT, (execution_id, sequence, kind, payload, "{}"), prepare=True
                )
            sequence += 1
        elif isinstance(step, AcquireFence):
            cursor = await conn.execute(ACQUIRE, (execution_id,), prepare=True)
            row = await cursor.fetchone()
            assert row is not None
            token = row[0]
        else:
            async with conn.transaction():
                await conn.execute(LOCK_FENCE, (execution_id,), prepare=True)
                cursor = await conn.execute(
                    ACQUIRE_IF,
                    (execution_id, park_token, execution_id, park_sequence, _ANSWERING,
                     _KERNEL),
                    prepare=True,
                )
                row = await cursor.fetchone()
            if row is None:
                raise ScenarioError(f"raw acquire_fence_if of {execution_id!r} was stale")
            token = row[0]


async def measure_raw_postgres(
    url: str, scenario: Scenario, plan: RunPlan, tick: Tick
) -> Sample:
    """One timed raw run: ``plan.concurrency`` connections, opened before the clock starts
    and closed after it stops."""
    connections: list[psycopg.AsyncConnection[tuple[int]]] = []
    try:
        for _ in range(plan.concurrency):
            connections.append(await psycopg.AsyncConnection.connect(url, autocommit=True))

        setup = scenario.setup_only

        async def warm(conn: psycopg.AsyncConnection[tuple[int]], index: int) -> None:
            if setup is not None:
                await _run_execution(conn, plan.warmup_id(index), setup)
            await _run_execution(conn, plan.warmup_id(index), scenario)

        async def set_up(conn: psycopg.AsyncConnection[tuple[int]], index: int) -> None:
            assert setup is not None
            await _run_execution(conn, plan.execution_id(index), setup)

        async def timed(conn: psycopg.AsyncConnection[tuple[int]], index: int) -> None:
            await _run_execution(conn, plan.execution_id(index), scenario)

        if plan.warmup:
            await drive_workers(plan.warmup, connections, warm)
        if setup is not None:
            await drive_workers(plan.executions, connections, set_up)
        return await drive_workers(plan.executions, connections, timed, tick)
    finally:
        for conn in connections:
            await conn.close()
