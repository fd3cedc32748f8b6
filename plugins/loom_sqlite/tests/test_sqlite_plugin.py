"""The ``sqlite`` URL scheme: registration through the ``loom`` entry point, the URL forms,
and option checking."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import loom_sqlite
import pytest
from loom_sqlite import SqliteEventStore, SqliteLeaseStore, SqliteTimerStore
from loom_sqlite.settings import parse_settings
from sqlite_helpers import names_in, url_for

from loom_core import InvalidOptionError, InvalidURLError, NewEvent, Storage, open_storage
from loom_core.spi import PluginHost


async def _pragma(storage: Storage, name: str) -> object:
    """A PRAGMA as the storage's own connection sees it (they are per connection)."""
    events = storage.events
    assert isinstance(events, SqliteEventStore)
    statements = {"synchronous": "PRAGMA synchronous", "journal_mode": "PRAGMA journal_mode",
                  "busy_timeout": "PRAGMA busy_timeout"}
    sql = statements[name]
    # The writer thread's connection: the one that waits for other processes' locks.
    return await events._runner.connection.call(
        lambda raw: raw.execute(sql).fetchone()[0], doing="test", write=False
    )


def test_the_entry_point_registers_the_sqlite_scheme() -> None:
    host = PluginHost()
    assert "sqlite" in host.backends.factories
    assert host.backends.source_of("sqlite") == "loom-sqlite"
    assert not host.errors


async def test_open_storage_gives_sqlite_stores_in_wal_mode(storage: Storage) -> None:
    assert isinstance(storage.events, SqliteEventStore)
    assert isinstance(storage.timers, SqliteTimerStore)
    assert isinstance(storage.leases, SqliteLeaseStore)
    assert storage.leases.scope == "host"
    assert await _pragma(storage, "journal_mode") == "wal"
    assert await _pragma(storage, "synchronous") == 1  # NORMAL
    assert await _pragma(storage, "busy_timeout") == 5000


async def test_the_loop_connection_never_waits_and_never_checkpoints(storage: Storage) -> None:
    """The event loop's connection (NORMAL only) has a zero busy timeout and no automatic
    checkpoint, so nothing run on it waits for a lock or syncs the disk."""
    events = storage.events
    assert isinstance(events, SqliteEventStore)
    loop_raw = events._runner.connection.loop_raw
    assert loop_raw is not None
    assert loop_raw.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    assert loop_raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    assert loop_raw.execute("PRAGMA synchronous").fetchone()[0] == 1


async def test_synchronous_full_and_busy_timeout_from_the_url(db_path: Path) -> None:
    url = url_for(db_path) + "?synchronous=full&busy_timeout_ms=250"
    async with open_storage(url) as storage:
        assert await _pragma(storage, "synchronous") == 2  # FULL
        assert await _pragma(storage, "busy_timeout") == 250


async def test_options_mapping_works_like_the_query_string(db_url: str) -> None:
    async with open_storage(db_url, options={"synchronous": "FULL"}) as storage:
        assert await _pragma(storage, "synchronous") == 2


async def test_a_relative_path_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with open_storage("sqlite:///relative.db") as storage:
        await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
    assert (tmp_path / "relative.db").is_file()
    with sqlite3.connect(tmp_path / "relative.db") as raw:
        assert raw.execute("SELECT count(*) FROM loom_events").fetchone() == (1,)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://host/loom.db", "names a host"),
        ("sqlite:///", "names no file"),
        ("sqlite:///dir/", "names no file"),
        ("sqlite:///:memory:", "memory://"),
        ("sqlite:///loom.db#frag", "fragment"),
        ("sqlite:///loom.db?synchronous", "malformed query"),
        ("sqlite:///lo\ud800om.db", "not UTF-8 text"),
    ],
)
async def test_a_bad_url_is_refused_naming_the_problem(url: str, message: str) -> None:
    with pytest.raises(InvalidURLError, match=message):
        await open_storage(url)


async def test_a_path_escaping_bytes_that_are_not_utf8_is_refused_and_no_file_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``%FF`` and ``%FE`` are no UTF-8: read as U+FFFD, both URLs would open one file."""
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///orders%FF.db", "sqlite:///orders%FE.db"):
        with pytest.raises(InvalidURLError, match="not UTF-8"):
            await open_storage(url)
    assert names_in(tmp_path) == []


@pytest.mark.parametrize(
    ("query", "options", "message"),
    [
        ("?synchronous=OFF", {}, "'NORMAL' or 'FULL'"),
        ("?busy_timeout_ms=soon", {}, "whole number"),
        ("?busy_timeout_ms=-1", {}, "between 0"),
        ("?subscribe_poll_ms=0", {}, "between 1"),
        ("?nope=1", {}, "unknown sqlite:/// URL option 'nope'"),
        ("?synchronous=FULL&synchronous=NORMAL", {}, "given twice"),
        ("?synchronous=FULL", {"synchronous": "FULL"}, "both in the URL and in options"),
        ("", {"busy_timeout_ms": True}, "must be an int"),
        ("", {"busy_timeout_ms": 1.5}, "must be an int"),
        ("", {"busy_timeout_ms": "5000"}, "must be an int"),
        ("", {"subscribe_poll_ms": "20"}, "must be an int"),
        ("", {"synchronous": 2}, "must be a str"),
        ("", {"clock": "now"}, "callable"),
        ("", {"offer": ()}, "unknown sqlite:/// option 'offer'"),
    ],
)
async def test_a_bad_option_is_refused_before_the_file_is_touched(
    db_path: Path, query: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        await open_storage(url_for(db_path) + query, options=options)
    assert "loom.db" not in names_in(db_path.parent)


def test_settings_keep_absolute_and_percent_encoded_paths() -> None:
    assert parse_settings("sqlite:////var/lib/loom.db", {}).path == "/var/lib/loom.db"
    assert parse_settings("sqlite:///my%20dir/loom.db", {}).path == "my dir/loom.db"
    assert parse_settings("SQLITE:///loom.db", {}).path == "loom.db"


def test_the_public_api_is_pinned() -> None:
    assert sorted(loom_sqlite.__all__) == [
        "DatabaseBusyError",
        "DatabaseClosedError",
        "DatabaseCorruptError",
        "DatabaseOpenError",
        "DatabaseReadOnlyError",
        "SchemaTooNewError",
        "Settings",
        "SeveralDatabasesError",
        "SqliteEventStore",
        "SqliteLeaseStore",
        "SqliteTimerStore",
        "Synchronous",
        "__version__",
        "backup",
        "backup_all",
        "open_sqlite",
    ]
    for name in loom_sqlite.__all__:
        assert hasattr(loom_sqlite, name)


def test_the_kernel_demo_runs_on_sqlite(db_url: str) -> None:
    # Run as a user runs it: the demo module is the kernel's, not part of its API.
    demo = subprocess.run(
        [sys.executable, "-m", "loom_core", "demo", "--url", db_url],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert demo.returncode == 0, demo.stderr
    assert "zombie A refused" in demo.stdout
    assert "EXECUTION_COMPLETED" in demo.stdout.splitlines()[-1]
    assert "loom.db" in names_in(Path(db_url.removeprefix("sqlite:///")).parent)
