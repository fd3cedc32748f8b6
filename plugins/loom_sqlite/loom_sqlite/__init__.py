"""Loom's SQLite backend: fenced event, timer and lease stores in one WAL file.

``pip install loom-sqlite`` registers the ``sqlite`` URL scheme, so
``open_storage("sqlite:///loom.db")`` opens it; see ``docs/sqlite.md``.
"""

from __future__ import annotations

from loom_sqlite.errors import (
    DatabaseBusyError,
    DatabaseClosedError,
    DatabaseCorruptError,
    DatabaseOpenError,
    DatabaseReadOnlyError,
    SchemaTooNewError,
    SeveralDatabasesError,
)
from loom_sqlite.events import SqliteEventStore
from loom_sqlite.leases import SqliteLeaseStore
from loom_sqlite.plugin import open_sqlite
from loom_sqlite.settings import Settings, Synchronous
from loom_sqlite.stacks import backup, backup_all
from loom_sqlite.timers import SqliteTimerStore

__version__ = "0.1.0"

__all__ = [
    "DatabaseBusyError",
    "DatabaseClosedError",
    "DatabaseCorruptError",
    "DatabaseOpenError",
    "DatabaseReadOnlyError",
    "SchemaTooNewError",
    "SeveralDatabasesError",
    "Settings",
    "SqliteEventStore",
    "SqliteLeaseStore",
    "SqliteTimerStore",
    "Synchronous",
    "__version__",
    "backup",
    "backup_all",
    "open_sqlite",
]
