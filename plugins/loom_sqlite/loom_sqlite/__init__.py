"""Loom's SQLite backend: fenced event, timer and lease stores in one WAL file.

``pip install loom-sqlite`` registers the ``sqlite`` URL scheme, so
``open_storage("sqlite:///loom.db")`` opens it; see ``docs/sqlite.md``.
"""

from __future__ import annotations

import os

from loom_core.errors import InvalidOptionError
from loom_core.storage import Storage
from loom_sqlite.errors import (
    DatabaseBusyError,
    DatabaseClosedError,
    DatabaseCorruptError,
    DatabaseOpenError,
    DatabaseReadOnlyError,
)
from loom_sqlite.events import SqliteEventStore
from loom_sqlite.leases import SqliteLeaseStore
from loom_sqlite.plugin import open_sqlite
from loom_sqlite.settings import Settings, Synchronous
from loom_sqlite.timers import SqliteTimerStore

__version__ = "0.1.0"

__all__ = [
    "DatabaseBusyError",
    "DatabaseClosedError",
    "DatabaseCorruptError",
    "DatabaseOpenError",
    "DatabaseReadOnlyError",
    "Settings",
    "SqliteEventStore",
    "SqliteLeaseStore",
    "SqliteTimerStore",
    "Synchronous",
    "__version__",
    "backup",
    "open_sqlite",
]

_MAX_DEPTH = 32


async def backup(storage: Storage, target_path: str | os.PathLike[str]) -> None:
    """Back up a SQLite ``storage`` to ``target_path`` online (SQLite's backup API).

    Finds the SQLite event store under any decorators (through their ``inner``); refuses
    with :class:`~loom_core.errors.InvalidOptionError` a storage that is not SQLite.
    """
    store: object = storage.events
    for _ in range(_MAX_DEPTH):
        if isinstance(store, SqliteEventStore):
            await store.backup(os.fspath(target_path))
            return
        inner = getattr(store, "inner", None)
        if inner is None:
            break
        store = inner
    raise InvalidOptionError(f"{storage!r} is not a SQLite storage; backup() needs sqlite:///")
