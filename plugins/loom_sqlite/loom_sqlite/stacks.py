"""Backing up a whole storage: every SQLite database under its decorators, or a refusal.

A decorated storage can sit on several databases: the sharded decorator wraps one store
per shard. Such a stack is walked through each decorator's ``wrapped`` stores
(:func:`loom_core.decorating.base_stores`), never by following ``inner`` alone, which
reaches shard 0 only and would report a partial backup as a success. :func:`backup`
writes one file and so refuses a storage spanning several databases; :func:`backup_all`
writes one file per database, or none at all.

Each database's copy is one consistent snapshot of that database (its log, fences, timers
and leases together); copies of different databases are taken one after the other, not at
one instant. That is enough for the sharded decorator, which keeps everything of an
execution (its log, token and timers) on one shard and refuses writes that span shards.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

from loom_core import Storage
from loom_core.decorating import base_stores
from loom_core.errors import InvalidOptionError
from loom_sqlite.errors import DatabaseOpenError, SeveralDatabasesError
from loom_sqlite.events import SqliteEventStore

__all__ = ["backup", "backup_all", "databases_of"]


def databases_of(storage: Storage) -> tuple[SqliteEventStore, ...]:
    """The SQLite event store of each database under ``storage``'s decorators, in branch
    (shard) order, each database once.

    Refuses (:class:`~loom_core.errors.InvalidOptionError`) a storage with any store at
    the bottom of its stack that is not SQLite: no SQLite backup can cover it.
    """
    if not isinstance(storage, Storage):
        raise InvalidOptionError(f"backup needs a Storage, not {type(storage).__name__}")
    stores = base_stores(storage)
    foreign = [(i, s) for i, s in enumerate(stores) if not isinstance(s, SqliteEventStore)]
    if len(foreign) == len(stores):
        raise InvalidOptionError(f"{storage!r} is not a SQLite storage; backup() needs sqlite:///")
    if foreign:
        named = ", ".join(f"store {i} ({type(s).__name__})" for i, s in foreign)
        raise InvalidOptionError(
            f"{storage!r} spans {len(stores)} stores and {named} is not SQLite; a SQLite "
            "backup cannot cover it: back each shard up with its own backend's tool"
        )
    unique: dict[str, SqliteEventStore] = {}
    for store in stores:
        assert isinstance(store, SqliteEventStore)
        unique.setdefault(os.path.realpath(store.path), store)
    return tuple(unique.values())


async def backup(storage: Storage, target_path: str | os.PathLike[str]) -> None:
    """Back up the SQLite database under ``storage`` to ``target_path`` online.

    Finds it under any decorators. Refuses a storage that is not SQLite
    (:class:`~loom_core.errors.InvalidOptionError`) and one that spans several databases
    (:class:`~loom_sqlite.errors.SeveralDatabasesError`: use :func:`backup_all`), before
    anything is written.
    """
    databases = databases_of(storage)
    if len(databases) > 1:
        raise SeveralDatabasesError(tuple(d.path for d in databases))
    await databases[0].backup(os.fspath(target_path))


async def backup_all(
    storage: Storage, directory: str | os.PathLike[str]
) -> Mapping[str, str]:
    """Back up every SQLite database under ``storage`` into ``directory``, one file each.

    The file for the database at index ``i`` (shard order) is
    ``<directory>/<i>-<the database's file name>``. Returns each database's path mapped
    to its copy, in that order. All or nothing: refuses before writing anything a storage
    that is not all SQLite, a missing directory (:class:`~loom_sqlite.DatabaseOpenError`)
    and a copy that would overwrite a file (:class:`~loom_core.errors.InvalidOptionError`);
    if one copy fails, the copies already written by this call are removed and its error
    is raised.
    """
    databases = databases_of(storage)
    targets = await asyncio.to_thread(_targets, databases, directory)
    written: list[str] = []
    try:
        for database in databases:
            target = targets[database.path]
            await database.backup(target)
            written.append(target)
    except BaseException:
        await asyncio.to_thread(_remove, written)
        raise
    return targets


def _targets(databases: tuple[SqliteEventStore, ...], directory: object) -> dict[str, str]:
    """Each database's copy in ``directory``, checked to be new (before anything is written)."""
    if not isinstance(directory, str | os.PathLike):
        raise InvalidOptionError(
            f"backup directory must be a path, not {type(directory).__name__}"
        )
    folder = os.path.abspath(os.fspath(directory))
    if not os.path.isdir(folder):
        raise DatabaseOpenError(folder, "the backup directory does not exist; create it")
    targets = {
        d.path: os.path.join(folder, f"{i}-{os.path.basename(d.path)}")
        for i, d in enumerate(databases)
    }
    existing = [t for t in targets.values() if os.path.lexists(t)]
    if existing:
        raise InvalidOptionError(f"backup target(s) {existing} exist; choose an empty directory")
    return targets


def _remove(paths: list[str]) -> None:
    for path in paths:
        os.remove(path)
