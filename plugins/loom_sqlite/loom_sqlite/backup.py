"""Online backup with SQLite's backup API.

A naive file copy of a live WAL database can be torn (the ``-wal`` file holds commits the
main file does not have yet), so it uses SQLite's backup API. The backup runs
on its own connection in a worker thread, so the storage keeps serving reads and writes
while it runs, and copies all pages in one step: one read transaction, hence one
consistent snapshot (WAL readers do not block writers; a step-by-step copy would restart
every time another connection wrote, and might never finish under load).

The copy is written to a temporary file beside the target, flushed to disk, and only then
linked into place, so a crash mid-backup never leaves a half-written file under the
target's name. An existing target is refused rather than overwritten.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import uuid
from typing import Final

from loom_core.errors import InvalidOptionError
from loom_sqlite.errors import DatabaseOpenError, translate
from loom_sqlite.settings import Settings

__all__ = ["backup_database"]

ALL_PAGES: Final = -1


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_target(source_path: str, target: str) -> None:
    if os.path.exists(target):
        raise InvalidOptionError(f"backup target {target!r} exists; choose a new path")
    if target == os.path.abspath(source_path):
        raise InvalidOptionError("backup target is the database itself")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise DatabaseOpenError(target, f"the directory {directory!r} does not exist; create it")


def _backup(source_path: str, target_path: str, busy_timeout_ms: int) -> None:
    target = os.path.abspath(target_path)
    _check_target(source_path, target)
    directory = os.path.dirname(target)
    partial = os.path.join(directory, f".{os.path.basename(target)}.{uuid.uuid4().hex}.partial")
    source = sqlite3.connect(source_path, timeout=busy_timeout_ms / 1000, isolation_level=None)
    try:
        destination = sqlite3.connect(partial, isolation_level=None)
        try:
            source.backup(destination, pages=ALL_PAGES)
        finally:
            destination.close()
        with open(partial, "rb+") as written:
            os.fsync(written.fileno())
        try:
            os.link(partial, target)  # unlike a rename, never replaces an existing file
        except FileExistsError:
            raise InvalidOptionError(
                f"backup target {target!r} appeared during the backup; it was left alone"
            ) from None
        _fsync_directory(directory)
    finally:
        source.close()
        for leftover in (partial, partial + "-journal", partial + "-wal", partial + "-shm"):
            if os.path.exists(leftover):
                os.remove(leftover)


async def backup_database(settings: Settings, target_path: str | os.PathLike[str]) -> None:
    """Copy the database at ``settings.path`` to ``target_path``, online.

    Refuses an existing target (:class:`~loom_core.errors.InvalidOptionError`) and a
    missing target directory (:class:`~loom_sqlite.errors.DatabaseOpenError`); a SQLite
    failure is the typed error for it, and leaves no file at ``target_path``.
    """
    if not isinstance(target_path, str | os.PathLike):
        raise InvalidOptionError(
            f"backup target must be a path, not {type(target_path).__name__}"
        )
    target = os.fspath(target_path)
    try:
        await asyncio.to_thread(_backup, settings.path, target, settings.busy_timeout_ms)
    except sqlite3.Error as exc:
        raise translate(
            exc,
            path=settings.path,
            doing=f"backing it up to {target!r}",
            write=True,
            busy_timeout_ms=settings.busy_timeout_ms,
        ) from exc
