"""Schema creation and migration: concurrent boots, the version table, ``migrate`` as a
deploy step, the timers-table migration, step 3 (and the retired park-fence backfill), and
steps 4 and 5."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import cast

import psycopg
import pytest
from loom_conformance.postgres import PostgresServer
from loom_postgres import (
    SCHEMA_VERSION,
    ConnectionRejectedError,
    SchemaMigrationError,
    backfill_park_fences,
    migrate,
)
from psycopg import sql

from loom_core import NewEvent, Redrive, StaleFenceError, Storage, TimerRecord, open_storage

Opener = Callable[..., Awaitable[Storage]]
Conn = psycopg.AsyncConnection[tuple[object, ...]]
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


async def _fetch(
    conn: Conn, query: str, params: tuple[object, ...] | None = None
) -> list[tuple[object, ...]]:
    cur = await conn.execute(query, params)
    return list(await cur.fetchall())


BOOT = textwrap.dedent(
    """
    import asyncio, sys, time
    from loom_core import NewEvent, open_storage

    async def main(url, schema, start, n):
        time.sleep(max(0.0, start - time.time()))
        async with open_storage(url, options={"schema": schema, "pool_min_size": 1}) as st:
            await st.events.append(f"boot-{n}", [NewEvent("EXECUTION_STARTED")],
                                   expected_sequence=0)
        print("booted", n)

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])))
    """
)


async def test_several_processes_booting_at_once_migrate_exactly_once(
    pg_url: str, schema: str, admin: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    processes = 6
    start = time.time() + 2.0  # every process imports first, then all open together
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", BOOT, pg_url, schema, str(start), str(n),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        for n in range(processes)
    ]
    results = [await p.communicate() for p in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err.decode()
        assert b"booted" in out
    assert await _fetch(admin, "SELECT version FROM loom_schema_version ORDER BY version") == [
        (version,) for version in range(1, SCHEMA_VERSION + 1)
    ]
    heads = await _fetch(admin, "SELECT count(*) FROM loom_executions")
    assert heads == [(processes,)]


async def test_boot_records_the_schema_version_and_a_second_boot_changes_nothing(
    open_pg: Opener, schema: str, admin: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    await open_pg(schema=schema)
    first = await _fetch(admin, "SELECT version, applied_at FROM loom_schema_version")
    await open_pg(schema=schema)
    assert await _fetch(admin, "SELECT version, applied_at FROM loom_schema_version") == first
    assert sorted(cast(int, row[0]) for row in first) == list(range(1, SCHEMA_VERSION + 1))


async def test_migrate_as_a_deploy_step_lets_nodes_boot_without_migrating(
    pg_url: str, schema: str
) -> None:
    with pytest.raises(SchemaMigrationError, match=r"run loom_postgres\.migrate"):
        await open_storage(pg_url, options={"schema": schema, "migrate": False})
    report = await migrate(pg_url, schema=schema)
    assert (report.version_before, report.version_after) == (0, SCHEMA_VERSION)
    assert report.schema == schema
    again = await migrate(pg_url, schema=schema)
    assert (again.version_before, again.backfilled_park_fences) == (SCHEMA_VERSION, None)
    async with open_storage(pg_url, options={"schema": schema, "migrate": False}) as storage:
        await storage.events.append("x", [NewEvent("EXECUTION_STARTED")], expected_sequence=0)
        assert await storage.events.head("x") == 1


async def test_a_version_1_schema_is_migrated_to_the_batched_event_insert(
    pg_url: str, schema: str, admin: Conn
) -> None:
    async with open_storage(pg_url, options={"schema": schema}) as storage:
        await storage.events.append("old", [NewEvent("EXECUTION_STARTED")], expected_sequence=0)
    # What a version 1 database lacks: step 2 and the function its loom_batch calls.
    await admin.execute("DELETE FROM loom_schema_version WHERE version >= 2")
    await admin.execute("DROP FUNCTION loom_write_events")
    with pytest.raises(SchemaMigrationError, match=r"at version 1,"):
        await open_storage(pg_url, options={"schema": schema, "migrate": False})
    report = await migrate(pg_url, schema=schema)
    assert (report.version_before, report.version_after) == (1, SCHEMA_VERSION)
    async with open_storage(pg_url, options={"schema": schema, "migrate": False}) as storage:
        await storage.events.append(
            "old", [NewEvent("STEP_COMPLETED"), NewEvent("EXECUTION_COMPLETED")],
            expected_sequence=1,
        )
        assert [e.kind for e in await storage.events.read("old")] == [
            "EXECUTION_STARTED", "STEP_COMPLETED", "EXECUTION_COMPLETED"
        ]


# -- the timers table gains redrive safely (docs/design.md, "Timers and re-drives") ------

OLD_TIMERS = """
CREATE TABLE loom_timers (
    execution_id text NOT NULL,
    wake_at timestamptz NOT NULL,
    PRIMARY KEY (execution_id, wake_at)
)
"""


async def test_an_old_timers_table_gains_redrive_and_keeps_its_rows(
    open_pg: Opener, schema: str, admin: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    await admin.execute(OLD_TIMERS)
    await admin.execute(
        "INSERT INTO loom_timers VALUES ('old', '2020-01-01T00:00:00Z')"
    )
    storage = await open_pg(schema=schema)
    rows = await storage.timers.pending("old")
    assert [(r.execution_id, r.redrive) for r in rows] == [("old", None)]
    wake = rows[0].wake_at
    await storage.timers.schedule(TimerRecord("old", wake, Redrive(2)))
    await storage.timers.schedule(TimerRecord("old", wake))
    assert (await storage.timers.pending("old"))[0].redrive == Redrive(2)


async def test_a_current_timers_table_is_not_locked_by_the_migration(
    pg_url: str, schema: str, admin: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    # A timers table that already has redrive (and its index), and a session holding a
    # write lock on it: the boot must check the catalog, not queue for ACCESS EXCLUSIVE.
    await admin.execute(OLD_TIMERS)
    await admin.execute("ALTER TABLE loom_timers ADD COLUMN redrive jsonb")
    await admin.execute("CREATE INDEX loom_timers_due ON loom_timers (wake_at, execution_id)")
    holder = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await holder.execute("SELECT set_config('search_path', %s, false)", (schema,))
        await holder.execute("INSERT INTO loom_timers VALUES ('held', now(), NULL)")
        # holder's transaction stays open (ROW EXCLUSIVE on loom_timers)
        async with open_storage(
            pg_url, options={"schema": schema, "migration_lock_timeout": 1.0}
        ) as storage:
            await storage.timers.schedule(TimerRecord("new", EPOCH))
            assert [r.execution_id for r in await storage.timers.due(EPOCH)] == ["new"]
    finally:
        await holder.rollback()
        await holder.close()


async def test_adding_the_column_behind_an_open_transaction_fails_cleanly_then_retries(
    pg_url: str, schema: str, admin: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    await admin.execute(OLD_TIMERS)
    holder = await psycopg.AsyncConnection.connect(pg_url)
    try:
        await holder.execute("SELECT set_config('search_path', %s, false)", (schema,))
        await holder.execute("SELECT count(*) FROM loom_timers")  # ACCESS SHARE, held
        with pytest.raises(SchemaMigrationError, match="retry the boot"):
            await open_storage(pg_url, options={"schema": schema, "migration_lock_timeout": 0.3})
    finally:
        await holder.rollback()
        await holder.close()
    # Nothing half-done was kept: no version recorded, the column still missing...
    assert await _fetch(admin, "SELECT to_regclass('loom_schema_version')") == [(None,)]
    # ...and the retried boot succeeds.
    async with open_storage(pg_url, options={"schema": schema}) as storage:
        await storage.timers.schedule(TimerRecord("x", EPOCH, Redrive(0)))
        assert (await storage.timers.pending("x"))[0].redrive == Redrive(0)


# -- the park-fence backfill ------------------------------------------------------------

OLD_LOGS: dict[str, list[tuple[str, dict[str, object]]]] = {
    # parked and unanswered: needs its token-0 row
    "parked": [("EXECUTION_STARTED", {}), ("EXECUTION_SUSPENDED", {})],
    # parked, then only an audit append: still unanswered
    "parked-denied": [("EXECUTION_STARTED", {}), ("EXECUTION_SUSPENDED", {}),
                      ("EXECUTION_DENIED", {})],
    # answered parks: no row
    "answered": [("EXECUTION_STARTED", {}), ("EXECUTION_SUSPENDED", {}),
                 ("EXECUTION_RESUMED", {})],
    "answered-by-newer-node": [("EXECUTION_STARTED", {}), ("EXECUTION_SUSPENDED", {}),
                               ("EXECUTION_FUTURE_KIND", {"kernel": True})],
    # never parked: no row
    "running": [("EXECUTION_STARTED", {}), ("STEP_COMPLETED", {})],
}


async def _write_old_logs(conn: psycopg.AsyncConnection[tuple[object, ...]],
                          logs: dict[str, list[tuple[str, dict[str, object]]]]) -> None:
    """Logs as a version without token-0 rows wrote them: events only, no fence rows."""
    for eid, events in logs.items():
        await conn.execute(
            "INSERT INTO loom_executions (execution_id, head) VALUES (%s, %s)", (eid, len(events))
        )
        for seq, (kind, metadata) in enumerate(events):
            await conn.execute(
                "INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, "
                "recorded_at) VALUES (%s, %s, %s, 'null', %s, now())",
                (eid, seq, kind, json.dumps(metadata)),
            )


async def _fence_rows(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> set[str]:
    rows = await _fetch(conn, "SELECT execution_id FROM loom_fences WHERE token = 0")
    return {str(r[0]) for r in rows}


async def test_a_boot_writes_no_fence_row_for_old_parks_and_the_retired_backfill_is_a_no_op(
    pg_url: str, schema: str, open_pg: Opener, admin: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    # Since schema 3 nothing needs a park's token-0 row: no boot scans for old parks, and
    # backfill_park_fences (kept for deploy scripts) touches nothing.
    await migrate(pg_url, schema=schema)
    await _write_old_logs(admin, OLD_LOGS)
    storage = await open_pg(schema=schema, backfill_park_fences=True)
    assert await _fence_rows(admin) == set()
    assert await backfill_park_fences(pg_url, schema=schema, batch_size=1) == 0
    assert await _fence_rows(admin) == set()
    report = await migrate(pg_url, schema=schema)
    assert report.backfilled_park_fences is None
    # A new park writes none either.
    await storage.events.append("new-park", OLD_PARK, expected_sequence=0)
    assert await _fetch(admin, "SELECT count(*) FROM loom_fences") == [(0,)]


OLD_PARK = [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")]


async def test_a_version_2_schema_is_migrated_and_its_old_signatures_are_dropped(
    pg_url: str, schema: str, admin: Conn
) -> None:
    async with open_storage(pg_url, options={"schema": schema}) as storage:
        await storage.events.append("old", OLD_PARK, expected_sequence=0)
    # What a version 2 database has instead of step 3: the old signatures (stand-ins with
    # the same argument types; their bodies do not matter, they must go).
    await admin.execute("DELETE FROM loom_schema_version WHERE version >= 3")
    await admin.execute(
        'CREATE FUNCTION loom_batch("char"[], text[], bigint[], bigint[], boolean[], '
        "boolean[], integer[], text[], text[], text[], text[], bigint, text[], text[], "
        "double precision) RETURNS void LANGUAGE sql AS 'SELECT'"
    )
    await admin.execute(
        "CREATE FUNCTION loom_copy_prefix(text, text, bigint, text, text, double precision) "
        "RETURNS void LANGUAGE sql AS 'SELECT'"
    )
    await admin.execute("DROP FUNCTION loom_fence_tokens")
    with pytest.raises(SchemaMigrationError, match=r"at version 2,"):
        await open_storage(pg_url, options={"schema": schema, "migrate": False})
    report = await migrate(pg_url, schema=schema)
    assert (report.version_before, report.version_after) == (2, SCHEMA_VERSION)
    arities = await _fetch(
        admin,
        "SELECT p.proname, p.pronargs FROM pg_proc p "
        "WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE 'loom%%' "
        "ORDER BY 1, 2",
        (schema,),
    )
    assert [name for name, _ in arities] == sorted(
        ["loom_acquire_fence_if", "loom_write_one", "loom_batch", "loom_copy_prefix",
         "loom_delete_execution",
         "loom_fence_tokens", "loom_retry_unless", "loom_truncate_prefix",
         "loom_write_events"]
    )
    assert {str(name): int(cast(int, n)) for name, n in arities}["loom_batch"] == 13
    async with open_storage(pg_url, options={"schema": schema, "migrate": False}) as storage:
        acquired = await storage.events.acquire_fence_if("old", fence=0, park_seq=1)
        assert acquired.acquired
        await storage.events.append(
            "old", [NewEvent("EXECUTION_RESUMED")], expected_sequence=2, fence=acquired.fence
        )
        assert await storage.events.copy_prefix("old", "branch", through_sequence=1) == 2


async def test_a_version_3_schema_gains_the_lone_append_function_on_first_connect(
    pg_url: str, schema: str, admin: Conn
) -> None:
    async with open_storage(pg_url, options={"schema": schema}) as storage:
        await storage.events.append("old", OLD_PARK, expected_sequence=0)
    # What a version 3 database lacks: step 4, loom_write_one (a lone append's statement).
    await admin.execute("DELETE FROM loom_schema_version WHERE version >= 4")
    await admin.execute("DROP FUNCTION loom_write_one")
    with pytest.raises(SchemaMigrationError, match=r"at version 3,"):
        await open_storage(pg_url, options={"schema": schema, "migrate": False})
    # Several nodes booting at once: the advisory lock lets one migrate, the others find
    # the work done.
    nodes = await asyncio.gather(
        *(open_storage(pg_url, options={"schema": schema}) for _ in range(3))
    )
    try:
        assert await _fetch(
            admin, "SELECT version FROM loom_schema_version WHERE version >= 4 ORDER BY 1"
        ) == [(version,) for version in range(4, SCHEMA_VERSION + 1)]
        written = await nodes[1].events.append(
            "old", [NewEvent("EXECUTION_RESUMED")], expected_sequence=2
        )
        assert written[0].sequence == 2
        assert [e.kind for e in await nodes[2].events.read("old")] == [
            "EXECUTION_STARTED", "EXECUTION_SUSPENDED", "EXECUTION_RESUMED"
        ]
    finally:
        for node in nodes:
            await node.close()


# loom_delete_execution as schemas 1 to 4 defined it: the token stays as it was.
DELETE_BEFORE_5 = """
CREATE OR REPLACE FUNCTION loom_delete_execution(p_id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $old$
DECLARE
    existed boolean;
BEGIN
    DELETE FROM loom_executions e WHERE e.execution_id = p_id;
    existed := FOUND;
    DELETE FROM loom_events e WHERE e.execution_id = p_id;
    DELETE FROM loom_fences f WHERE f.execution_id = p_id AND f.token = 0;
    RETURN existed;
END
$old$
"""


async def test_a_version_4_schema_gains_the_delete_that_moves_the_token_on_first_connect(
    pg_url: str, schema: str, admin: Conn
) -> None:
    async with open_storage(pg_url, options={"schema": schema}) as storage:
        await storage.events.append("held", OLD_PARK, expected_sequence=0, fence=0)
        await storage.events.append("unfenced", OLD_PARK, expected_sequence=0)
    await _write_old_logs(admin, {"old-token-0": OLD_LOGS["parked"]})
    await admin.execute(
        "INSERT INTO loom_fences (execution_id, token) VALUES ('old-token-0', 0)"
    )
    # What a version 4 database has: the delete that keeps the token.
    await admin.execute("DELETE FROM loom_schema_version WHERE version >= 5")
    await admin.execute(DELETE_BEFORE_5)
    with pytest.raises(SchemaMigrationError, match=r"at version 4,"):
        await open_storage(pg_url, options={"schema": schema, "migrate": False})
    nodes = await asyncio.gather(
        *(open_storage(pg_url, options={"schema": schema}) for _ in range(2))
    )
    try:
        assert await _fetch(
            admin, "SELECT version FROM loom_schema_version WHERE version >= 5"
        ) == [(5,)]
        for execution_id in ("held", "unfenced", "old-token-0"):
            assert await nodes[0].events.delete_execution(execution_id) is True
            await nodes[1].events.append(execution_id, OLD_PARK, expected_sequence=0)
            with pytest.raises(StaleFenceError) as caught:
                await nodes[1].events.append(
                    execution_id, [NewEvent("EXECUTION_RESUMED")], expected_sequence=2, fence=0
                )
            assert caught.value.current_fence == 1
        assert await nodes[0].events.delete_execution("never") is False
        assert await _fetch(
            admin, "SELECT execution_id, token FROM loom_fences ORDER BY 1"
        ) == [("held", 1), ("old-token-0", 1), ("unfenced", 1)]
    finally:
        for node in nodes:
            await node.close()


async def test_a_park_written_with_no_fence_row_is_safe_without_any_backfill(
    pg_url: str, schema: str, open_pg: Opener, admin: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    # Parks from before token-0 rows, never backfilled: the head row orders the answer
    # and the conditional acquire (one side wins, never both). The interleavings are
    # forced in test_races; this is the same race left to the scheduler, on old logs.
    await migrate(pg_url, schema=schema)
    logs = {f"old-{i}": OLD_LOGS["parked"] for i in range(40)}
    await _write_old_logs(admin, logs)
    node_a = await open_pg(schema=schema)
    node_b = await open_pg(schema=schema)
    from loom_core.errors import StaleFenceError

    for eid in logs:
        async def answer(eid: str = eid) -> bool:
            try:
                await node_a.events.append(eid, [NewEvent("EXECUTION_RESUMED")],
                                           expected_sequence=2, fence=0)
            except StaleFenceError:
                return False
            return True

        appended, acquired = await asyncio.gather(
            answer(), node_b.events.acquire_fence_if(eid, fence=0, park_seq=1)
        )
        assert appended != acquired.acquired
    assert await _fence_rows(admin) == set()


async def test_a_read_only_database_is_a_schema_migration_error_and_nothing_is_created(
    loom_postgres_server: PostgresServer,
) -> None:
    # A node pointed at a standby (or a database made read-only): the boot's DDL is
    # refused, and the caller gets the Loom error that says so, not psycopg's.
    url = loom_postgres_server.fresh_database("loom_read_only")
    name = url.rsplit("/", 1)[1]
    async with await psycopg.AsyncConnection.connect(
        loom_postgres_server.url, autocommit=True
    ) as conn:
        await conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
                sql.Identifier(name)
            )
        )
    with pytest.raises(SchemaMigrationError, match="read-only transaction"):
        await open_storage(url, options={"schema": "loom_ro"})
    with pytest.raises(SchemaMigrationError, match="read-only transaction"):
        await migrate(url, schema="loom_ro")
    async with await psycopg.AsyncConnection.connect(url) as conn:
        found = await _fetch(
            conn, "SELECT 1 FROM pg_namespace WHERE nspname = %s", ("loom_ro",)
        )
    assert found == []


async def test_migrate_on_a_database_that_does_not_exist_is_a_rejected_connection(
    pg_url: str,
) -> None:
    missing = pg_url.rsplit("/", 1)[0] + "/no_such_database_here"
    with pytest.raises(ConnectionRejectedError, match='"no_such_database_here" does not exist'):
        await migrate(missing)
