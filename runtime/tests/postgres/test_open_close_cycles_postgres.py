"""Opening and closing again and again on PostgreSQL leaves nothing behind: after 100
opens and closes of a storage, and 50 entries and exits of an app that ran an execution
each time, this process holds no more file descriptors, threads or asyncio tasks, and the
server no more backends on the database, than after the first few (a leak of one a
cycle shows as dozens)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading

import psycopg  # type: ignore[import-not-found, unused-ignore]
from loom_conformance.postgres import PostgresServer, loom_postgres_server
from loom_runtime import Context, Loom

from loom_core import NewEvent, open_storage

__all__ = ["loom_postgres_server"]  # the session's server, a fixture

BACKENDS = (  # clients only: an autovacuum worker on the database comes and goes
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
)


async def held(url: str) -> tuple[int, int, int, int]:
    """File descriptors, threads and asyncio tasks of this process, and the server's
    backends on the database (a connection opened and closed to count them)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        row = await (await admin.execute(BACKENDS)).fetchone()
    assert row is not None
    gc.collect()
    return (
        len(os.listdir("/proc/self/fd")),
        len(threading.enumerate()),
        len(asyncio.all_tasks()),
        row[0],
    )


async def test_opening_and_closing_a_storage_100_times_leaves_nothing_behind(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_cycles")
    for _ in range(3):  # the first opens create the schema and cache what later ones share
        await (await open_storage(url)).close()
    before = await held(url)
    for n in range(100):
        storage = await open_storage(url)
        await storage.events.append(f"e{n}", [NewEvent("A")], expected_sequence=0)
        await storage.close()
    assert await held(url) == before


async def test_entering_and_leaving_an_app_50_times_leaves_nothing_behind(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_cycles")

    def app() -> Loom:
        built = Loom(url, node="n1")

        @built.workflow(name="one")
        async def one(ctx: Context) -> int:
            return 1

        return built

    for _ in range(3):
        async with app():
            pass
    before = await held(url)
    for n in range(50):
        async with app() as entered:
            assert await entered.execute("one", id=f"e{n}") == 1
    assert await held(url) == before
