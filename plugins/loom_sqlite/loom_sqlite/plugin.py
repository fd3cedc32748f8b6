"""Registers the ``sqlite`` URL scheme with Loom (entry point ``loom`` → ``sqlite``).

``open_storage("sqlite:///loom.db")`` lands in :func:`open_sqlite`, which checks the URL
and options, opens the file in WAL mode, creates or migrates the tables, and returns a
:class:`~loom_core.Storage` whose event, timer and lease stores share one
connection (closed with the storage).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from loom_core import Storage
from loom_core.spi import BackendRegistry, hookimpl
from loom_sqlite.connection import open_connection
from loom_sqlite.events import SqliteEventStore
from loom_sqlite.leases import SqliteLeaseStore
from loom_sqlite.schema import ensure_schema
from loom_sqlite.settings import parse_settings
from loom_sqlite.subscribe import Subscriptions
from loom_sqlite.timers import SqliteTimerStore
from loom_sqlite.transactions import TransactionRunner

__all__ = ["loom_register_backends", "open_sqlite"]


async def open_sqlite(url: str, options: Mapping[str, object]) -> Storage:
    """Open the SQLite storage at ``url``; see :mod:`loom_sqlite.settings` for options.

    Refuses a bad URL or option (:class:`~loom_core.errors.InvalidURLError`,
    :class:`~loom_core.errors.InvalidOptionError`) before touching the file, and a file
    that cannot be used with the typed error that says why (:mod:`loom_sqlite.errors`).
    """
    settings = parse_settings(url, options)
    connection = await open_connection(settings)
    try:
        await connection.call(
            partial(ensure_schema, path=settings.path),
            doing="creating or migrating its tables",
            write=True,
        )
    except BaseException:
        await connection.close()
        raise
    runner = TransactionRunner(connection)
    subscriptions = Subscriptions(runner, settings.subscribe_poll_ms)

    async def close() -> None:
        await subscriptions.close()
        await runner.close()

    return Storage(
        SqliteEventStore(runner, subscriptions, settings.clock),
        SqliteTimerStore(runner),
        SqliteLeaseStore(runner, settings.clock),
        url=url,
        on_close=close,
    )


@hookimpl
def loom_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend("sqlite", open_sqlite)
