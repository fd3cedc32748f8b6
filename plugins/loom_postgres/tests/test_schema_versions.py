"""What a node's boot says about the schema it finds, when migrating is not the remedy.

A schema a newer loom-postgres migrated: a node of this version (one rolled back, or not
yet upgraded) refuses it at boot and in ``migrate()``, naming both versions, and writes
nothing. A schema the owner migrated as a deploy step, which the node's role may not use:
the boot says to grant it, not to migrate it again."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import psycopg
import pytest
from loom_postgres import SCHEMA_VERSION, SchemaMigrationError, SchemaTooNewError, migrate
from psycopg import sql

from loom_core import NewEvent, StorageUnavailableError, open_storage

Conn = psycopg.AsyncConnection[tuple[object, ...]]

NEWER = 1000
"""A schema version no loom-postgres has reached yet."""


async def _snapshot(conn: Conn) -> list[list[tuple[object, ...]]]:
    """What a refused boot must leave as it was: the version rows and the logs."""
    queries = (
        "SELECT version, description, applied_at FROM loom_schema_version ORDER BY version",
        "SELECT execution_id, sequence, kind FROM loom_events ORDER BY 1, 2",
        "SELECT execution_id, head FROM loom_executions ORDER BY 1",
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() ORDER BY 1",
    )
    return [list(await (await conn.execute(query)).fetchall()) for query in queries]


async def _migrated_by_a_newer_version(pg_url: str, schema: str, admin: Conn) -> None:
    async with open_storage(pg_url, options={"schema": schema}) as storage:
        await storage.events.append("a", [NewEvent("STEP_COMPLETED")], expected_sequence=0)
    await admin.execute(
        "INSERT INTO loom_schema_version (version, description) VALUES (%s, %s)",
        (NEWER, "a step this version does not know"),
    )


def _check(error: SchemaTooNewError, schema: str) -> None:
    assert isinstance(error, SchemaMigrationError)
    assert isinstance(error, StorageUnavailableError)
    assert (error.schema, error.found, error.supported) == (schema, NEWER, SCHEMA_VERSION)
    message = str(error)
    assert f"version {NEWER}" in message
    assert f"up to {SCHEMA_VERSION}" in message
    assert "Upgrade loom-postgres" in message
    assert "nothing was written" in message


@pytest.mark.parametrize("migrate_on_boot", [True, False])
async def test_a_boot_on_a_schema_a_newer_version_migrated_is_refused_and_writes_nothing(
    pg_url: str, schema: str, admin: Conn, migrate_on_boot: bool
) -> None:
    await _migrated_by_a_newer_version(pg_url, schema, admin)
    before = await _snapshot(admin)
    with pytest.raises(SchemaTooNewError) as caught:
        await open_storage(pg_url, options={"schema": schema, "migrate": migrate_on_boot})
    _check(caught.value, schema)
    assert await _snapshot(admin) == before


async def test_migrate_on_a_schema_a_newer_version_migrated_is_refused_and_writes_nothing(
    pg_url: str, schema: str, admin: Conn
) -> None:
    await _migrated_by_a_newer_version(pg_url, schema, admin)
    # A table the bookkeeping would create, dropped: a refused migrate() must not add it.
    await admin.execute("DROP TABLE loom_maintenance")
    before = await _snapshot(admin)
    with pytest.raises(SchemaTooNewError) as caught:
        await migrate(pg_url, schema=schema)
    _check(caught.value, schema)
    assert await _snapshot(admin) == before


async def test_a_role_that_may_not_use_a_migrated_schema_is_told_to_get_a_grant(
    pg_url: str, schema: str, admin: Conn
) -> None:
    await migrate(pg_url, schema=schema)  # the deploy step, as the owner
    role = f"loom_app_{uuid.uuid4().hex[:12]}"
    await admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    as_role = f"{pg_url}?options={quote(f'-c role={role}')}"
    before = await _snapshot(admin)
    try:
        for migrate_on_boot in (True, False):
            with pytest.raises(SchemaMigrationError) as caught:
                await open_storage(
                    as_role, options={"schema": schema, "migrate": migrate_on_boot}
                )
            message = str(caught.value)
            assert f"GRANT USAGE ON SCHEMA {schema} TO {role}" in message
            assert "version 0" not in message
            assert "migrate()" not in message
        assert await _snapshot(admin) == before
        for grant in (
            "GRANT USAGE ON SCHEMA {schema} TO {role}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
            "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}",
        ):
            await admin.execute(
                sql.SQL(grant).format(schema=sql.Identifier(schema), role=sql.Identifier(role))
            )
        options = {"schema": schema, "migrate": False}
        async with await open_storage(as_role, options=options) as storage:
            await storage.events.append("b", [NewEvent("STEP_COMPLETED")], expected_sequence=0)
    finally:
        await admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        await admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
