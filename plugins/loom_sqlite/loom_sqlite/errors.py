"""What a SQLite failure means, as a typed :class:`~loom_core.errors.LoomError`.

The SQLite-specific errors refine the kernel's storage errors, so a caller that handles
``StorageError`` (or one of its three kinds) handles these too::

    InvalidInputError
    └── InvalidOptionError
        └── SeveralDatabasesError      backup() of a storage spanning several databases
    StorageError
    ├── StorageWriteError
    │   └── DatabaseReadOnlyError      the file or its directory cannot be written
    ├── StorageReadError
    │   └── DatabaseCorruptError       not a SQLite database, or a damaged one
    └── StorageUnavailableError
        ├── DatabaseBusyError          another connection held the write lock too long
        ├── DatabaseOpenError          the file cannot be opened (missing directory, …)
        │   └── SchemaTooNewError      a newer loom-sqlite wrote the file: upgrade this one
        └── StoreClosedError
            └── DatabaseClosedError    the storage was closed

Every write runs in one transaction, so each of these means the write that raised it
left the file exactly as it was (a failed ``COMMIT`` is rolled back); the message says
what happened and what to do.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from loom_core.errors import (
    InvalidOptionError,
    StorageError,
    StorageReadError,
    StorageUnavailableError,
    StorageWriteError,
    StoreClosedError,
)

__all__ = [
    "DatabaseBusyError",
    "DatabaseClosedError",
    "DatabaseCorruptError",
    "DatabaseOpenError",
    "DatabaseReadOnlyError",
    "SchemaTooNewError",
    "SeveralDatabasesError",
    "translate",
]

_BUSY: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_CORRUPT: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


class DatabaseBusyError(StorageUnavailableError):
    """Another connection held the database's write lock for longer than ``busy_timeout_ms``.

    Nothing was written. Retry, or open the storage with a larger ``busy_timeout_ms``.
    """

    def __init__(self, path: str, busy_timeout_ms: int, doing: str) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        super().__init__(
            f"SQLite database {path!r} stayed locked by another connection for more than "
            f"busy_timeout_ms={busy_timeout_ms} while {doing}; nothing was written: retry, "
            "or open it with a larger busy_timeout_ms"
        )


class DatabaseOpenError(StorageUnavailableError):
    """The database file cannot be opened or created; ``reason`` says why."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot open SQLite database {path!r}: {reason}")


class SchemaTooNewError(DatabaseOpenError):
    """The file's schema (``found``) is newer than the newest this loom-sqlite knows
    (``supported``): a newer loom-sqlite migrated it. Refused before anything is written,
    since this version would misread or damage tables it does not know. Upgrade
    loom-sqlite in this process to the version that migrated the file, or restore the
    backup taken before the upgrade."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            path,
            f"its schema is version {found}, newer than this loom-sqlite knows (up to "
            f"{supported}): a newer loom-sqlite migrated it; nothing was written. Upgrade "
            "loom-sqlite in this process (pip install -U loom-sqlite) to the version that "
            "migrated the file, or restore the backup taken before that upgrade",
        )


class DatabaseClosedError(StoreClosedError):
    """An operation on a storage after :meth:`~loom_core.Storage.close`."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"SQLite storage {path!r}")


class DatabaseReadOnlyError(StorageWriteError):
    """A write refused because the file (or its directory, which holds the ``-wal`` and
    ``-shm`` files) is read-only. Nothing was written."""

    def __init__(self, path: str, doing: str) -> None:
        self.path = path
        super().__init__(
            f"SQLite database {path!r} is read-only while {doing}; nothing was written: "
            "make the file and its directory writable (SQLite creates the -wal and -shm "
            "files beside it)"
        )


class DatabaseCorruptError(StorageReadError):
    """The file is not a SQLite database, or its pages are damaged."""

    def __init__(self, path: str, detail: str, doing: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(
            f"SQLite database {path!r} is not a database or is damaged ({detail}) while "
            f"{doing}; restore it from a backup (see the loom-sqlite docs, 'Backup')"
        )


class SeveralDatabasesError(InvalidOptionError):
    """``backup()`` of a storage whose stack spans several SQLite databases (a sharded
    storage: one per shard); one file cannot hold them. ``paths`` lists the databases, in
    shard order. Nothing was written: use ``loom_sqlite.backup_all(storage, directory)``,
    which writes one file per database."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        super().__init__(
            f"this storage spans {len(paths)} SQLite databases ({', '.join(paths)}), and "
            "backup() writes one file: nothing was written. Back them all up with "
            "loom_sqlite.backup_all(storage, directory), one file per database"
        )


def translate(
    exc: sqlite3.Error, *, path: str, doing: str, write: bool, busy_timeout_ms: int
) -> StorageError:
    """The typed error for a ``sqlite3`` failure while ``doing`` something to ``path``."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    detail = str(exc) or type(exc).__name__
    if primary in _BUSY:
        return DatabaseBusyError(path, busy_timeout_ms, doing)
    if primary in _CORRUPT:
        return DatabaseCorruptError(path, detail, doing)
    if primary == sqlite3.SQLITE_READONLY:
        return DatabaseReadOnlyError(path, doing)
    if primary == sqlite3.SQLITE_CANTOPEN:
        return DatabaseOpenError(path, f"{detail} while {doing}")
    if primary == sqlite3.SQLITE_FULL:
        return StorageWriteError(
            f"SQLite database {path!r}: the disk is full while {doing}; nothing was written"
        )
    if write:
        return StorageWriteError(
            f"SQLite database {path!r} failed while {doing}: {detail}; the transaction was "
            "rolled back, nothing was written"
        )
    return StorageReadError(f"SQLite database {path!r} failed while {doing}: {detail}")
