"""Opening a file another loom-sqlite version wrote: one a newer version migrated is
refused, naming both versions, and left exactly as it was (a rollback must not act on
tables it does not know)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from loom_sqlite import DatabaseOpenError, SchemaTooNewError
from loom_sqlite.schema import SCHEMA_VERSION
from sqlite_helpers import file_bytes, url_for

from loom_core import NewEvent, StorageUnavailableError, open_storage

NEWER = 1000
"""A schema version no loom-sqlite has reached yet."""


async def _file_a_newer_version_migrated(path: Path) -> None:
    async with open_storage(url_for(path)) as storage:
        await storage.events.append("a", [NewEvent("STEP_COMPLETED")], expected_sequence=0)
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        # What a future migration would leave: its version, and a table this one lacks.
        raw.execute("CREATE TABLE loom_future (x INTEGER)")
        raw.execute("PRAGMA user_version = 1000")
    finally:
        raw.close()


async def test_a_file_of_a_newer_schema_is_refused_and_left_unchanged(db_path: Path) -> None:
    await _file_a_newer_version_migrated(db_path)
    before = file_bytes(db_path)
    with pytest.raises(SchemaTooNewError) as caught:
        await open_storage(url_for(db_path))
    error = caught.value
    assert isinstance(error, DatabaseOpenError)
    assert isinstance(error, StorageUnavailableError)
    assert (error.found, error.supported) == (NEWER, SCHEMA_VERSION)
    assert error.path == str(db_path)
    message = str(error)
    assert f"version {NEWER}" in message
    assert f"up to {SCHEMA_VERSION}" in message
    assert "Upgrade loom-sqlite" in message
    assert "nothing was written" in message
    assert file_bytes(db_path) == before
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (NEWER,)
    finally:
        raw.close()

