"""Fixtures: one throwaway PostgreSQL server per session (loom_conformance.postgres),
one database, and a fresh schema for every storage a test opens (fast: no CREATE
DATABASE per test)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import psycopg
import pytest
from loom_conformance.postgres import PostgresServer, loom_postgres_server
from psycopg import sql

from loom_core import Storage, open_storage

__all__ = ["loom_postgres_server"]

Opener = Callable[..., Awaitable[Storage]]


@pytest.fixture(scope="session")
def pg_url(loom_postgres_server: PostgresServer) -> str:
    """The session's test database."""
    return loom_postgres_server.fresh_database("loom_pg_tests")


def new_schema() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def schema() -> str:
    """A new schema name, for tests that open several nodes on one schema."""
    return new_schema()


@pytest.fixture
async def open_pg(pg_url: str) -> AsyncIterator[Opener]:
    """``await open_pg(**options)`` opens a storage on a fresh schema; pass ``schema=``
    to open a second node on the same one. Everything is closed after the test."""
    opened: list[Storage] = []

    async def opener(**options: Any) -> Storage:
        options.setdefault("schema", new_schema())
        storage = await open_storage(pg_url, options=options)
        opened.append(storage)
        return storage

    yield opener
    for storage in opened:
        await storage.close()


@pytest.fixture
async def admin(pg_url: str, schema: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A plain autocommit connection whose search_path is the test's schema (created empty
    if the store has not created it yet), for reading and tampering with the tables."""
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
    yield conn
    await conn.close()


@pytest.fixture
def loom_storage_factory(open_pg: Opener) -> Callable[[], Awaitable[Storage]]:
    """The conformance kit's one override point: a fresh, empty PostgreSQL storage per
    call."""

    async def factory() -> Storage:
        return await open_pg()

    return factory


@pytest.fixture
def loom_explorer_isolation() -> Literal["store", "execution"]:
    """The kit's schedule explorer runs its 2,047 schedules on their own execution ids in
    one storage: opening a pool and a schema per schedule would take minutes."""
    return "execution"
