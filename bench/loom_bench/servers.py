"""Where the PostgreSQL rows run: the server at ``--postgres-url``, or a throwaway one.

A throwaway cluster is started through the conformance kit's harness
(``loom_conformance.postgres``), the one the PostgreSQL backend's tests use, with its
``DURABLE_SETTINGS`` (``fsync`` and full-page writes on: every commit reaches the disk, as
in production; the test settings turn fsync off and would flatter every row), on loopback,
in a fresh database, and destroyed at the end. ``LOOM_TEST_POSTGRES_URL`` is deliberately
not consulted: a benchmark names its server with ``--postgres-url``. Without a URL and
without the kit, the PostgreSQL rows are reported as unavailable, with what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["ServerUnavailable", "postgres_server"]


class ServerUnavailable(Exception):
    """No PostgreSQL server could be had; the message says how to provide one."""


@contextlib.asynccontextmanager
async def postgres_server(url: str | None) -> AsyncIterator[tuple[str, str]]:
    """Yield ``(url, origin)``: the given URL, or a throwaway server's, stopped on exit.

    ``origin`` says which, for the report (a URL's password is never reported).
    """
    if url:
        yield url, "server given by --postgres-url"
        return
    try:
        harness: Any = importlib.import_module("loom_conformance.postgres")
    except ImportError as exc:
        raise ServerUnavailable(
            "no --postgres-url given and the throwaway-server harness "
            f"(loom_conformance.postgres) cannot be imported ({exc}); pass "
            "--postgres-url postgresql://user@host/db or pip install -e conformance"
        ) from None
    context = harness.postgres_server(harness.DURABLE_SETTINGS, use_environment=False)
    try:
        server = await asyncio.to_thread(context.__enter__)
    except Exception as exc:
        raise ServerUnavailable(f"the throwaway PostgreSQL server did not start: {exc}") from exc
    try:
        try:
            database = await asyncio.to_thread(server.fresh_database, "loom_bench")
        except Exception as exc:
            raise ServerUnavailable(f"no database on the throwaway server: {exc}") from exc
        yield str(database), "throwaway server (loom_conformance.postgres, DURABLE_SETTINGS)"
    finally:
        await asyncio.to_thread(context.__exit__, None, None, None)
