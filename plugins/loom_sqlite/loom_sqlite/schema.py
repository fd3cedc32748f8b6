"""The tables, and bringing an existing file up to date when it is opened.

Everything lives in one file, so one backup captures the log, the fence tokens, the
timers and the leases together. Tables are prefixed ``loom_`` so the
file can be shared with an application's own tables.

- ``loom_logs``: a row for a log whose head its events alone may not give, written when a
  truncation or a copy sets where the log starts; ``floor`` is the head the log has at
  least. The head (the next sequence) is one past the log's last event, and never below
  ``floor`` (a log truncated to nothing keeps its head there). An append writes no row
  here, only its events; a log exists while it has events or a row here.
- ``loom_events``: the log. Nothing derived from an event is stored beside it: the
  answering classification is computed from ``kind`` and ``metadata`` when the
  conditional fence scans (:mod:`loom_sqlite.fencing`).
- ``loom_fences``: one row per fenced execution; outlives the log when its token is > 0.
- ``loom_timers``: keyed by (execution_id, wake_at); ``redrive`` is JSON.
- ``loom_leases``: one row per held lease.

Times are INTEGER microseconds since the epoch (:mod:`loom_sqlite.clock`).

Opening is safe when several processes open one file together: every change runs in one
``BEGIN IMMEDIATE`` transaction (one process at a time), is written to be a no-op when it
is already done (``IF NOT EXISTS``), and each migration looks at the columns first, in
that same transaction. There are three:

- a timer table from before re-drives lacks ``redrive``: the column is added
  (tolerating a duplicate column in case a tool outside Loom added it meanwhile);
- an event table of schema 1 carries a derived ``answering`` column and its partial
  index ``loom_events_answering``: both are dropped. A flag stored beside the event could
  be flipped in the file without touching ``kind`` or ``metadata`` (what an audit chain
  covers), and the conditional fence would trust it; it is now derived when it is needed.
  ``DROP COLUMN`` rewrites the table once, under the write lock: another process opening
  the file meanwhile waits (up to its ``busy_timeout_ms``) and then finds it done. A
  process of an older loom-sqlite still writing the file fails its appends with a
  ``StorageWriteError`` (no such column), writing nothing: upgrade every process that
  shares a file together.
- a file of schema 2 keeps each log's head in ``loom_executions``, moved by every append:
  the table is renamed ``loom_logs`` and its ``head`` column ``floor`` (a head that was
  exact is a floor that holds). The rename is what keeps an older loom-sqlite from
  misreading the file: its heads would have stopped moving, and it fails on the missing
  table instead (a ``StorageReadError`` or ``StorageWriteError``, writing nothing).

A file already at :data:`SCHEMA_VERSION` is not written at all, so a read-only copy opens.
A file past it (a newer loom-sqlite migrated it) is refused with
:class:`~loom_sqlite.errors.SchemaTooNewError`, also without a write: this version does
not know what the newer one changed, and a rolled-back process must not act on it.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from loom_sqlite.errors import SchemaTooNewError

__all__ = ["SCHEMA_VERSION", "ensure_schema"]

SCHEMA_VERSION: Final = 3
"""``PRAGMA user_version`` of a file whose schema is complete. 0 is a new file or one
written before the version was recorded (possibly with an old-shape timer table); 1 has
the derived ``answering`` column on ``loom_events``; 2 keeps every head, moved by each
append, in ``loom_executions``."""

READ_VERSION: Final = "PRAGMA user_version"
# PRAGMA takes no bind parameters; the version is a constant of this module.
WRITE_VERSION: Final = "PRAGMA user_version = 3"

CREATE_LOGS: Final = """
CREATE TABLE IF NOT EXISTS loom_logs (
    execution_id TEXT NOT NULL PRIMARY KEY,
    floor INTEGER NOT NULL
) WITHOUT ROWID
"""
TABLES: Final = "SELECT name FROM sqlite_schema WHERE type = 'table'"
RENAME_EXECUTIONS: Final = "ALTER TABLE loom_executions RENAME TO loom_logs"
RENAME_HEAD: Final = "ALTER TABLE loom_logs RENAME COLUMN head TO floor"

CREATE_EVENTS: Final = """
CREATE TABLE IF NOT EXISTS loom_events (
    execution_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    metadata TEXT NOT NULL,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (execution_id, sequence)
) WITHOUT ROWID
"""

EVENT_COLUMNS: Final = "SELECT name FROM pragma_table_info('loom_events')"
DROP_ANSWERING_INDEX: Final = "DROP INDEX IF EXISTS loom_events_answering"
DROP_ANSWERING: Final = "ALTER TABLE loom_events DROP COLUMN answering"

CREATE_FENCES: Final = """
CREATE TABLE IF NOT EXISTS loom_fences (
    execution_id TEXT NOT NULL PRIMARY KEY,
    token INTEGER NOT NULL
) WITHOUT ROWID
"""

CREATE_TIMERS: Final = """
CREATE TABLE IF NOT EXISTS loom_timers (
    execution_id TEXT NOT NULL,
    wake_at INTEGER NOT NULL,
    redrive TEXT,
    PRIMARY KEY (execution_id, wake_at)
)
"""

OLD_TIMERS: Final = """
CREATE TABLE loom_timers (
    execution_id TEXT NOT NULL,
    wake_at INTEGER NOT NULL,
    PRIMARY KEY (execution_id, wake_at)
)
"""
"""The timer table as it was before re-drives (no ``redrive``); for migration tests."""

CREATE_TIMERS_DUE_INDEX: Final = """
CREATE INDEX IF NOT EXISTS loom_timers_due ON loom_timers (wake_at, execution_id)
"""

TIMER_COLUMNS: Final = "SELECT name FROM pragma_table_info('loom_timers')"
ADD_REDRIVE: Final = "ALTER TABLE loom_timers ADD COLUMN redrive TEXT"

CREATE_LEASES: Final = """
CREATE TABLE IF NOT EXISTS loom_leases (
    lease_key TEXT NOT NULL PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID
"""

_CREATE: Final = (
    CREATE_LOGS,
    CREATE_EVENTS,
    CREATE_FENCES,
    CREATE_TIMERS,
    CREATE_TIMERS_DUE_INDEX,
    CREATE_LEASES,
)


def _add_redrive_column(raw: sqlite3.Connection) -> None:
    columns = {row[0] for row in raw.execute(TIMER_COLUMNS)}
    if "redrive" in columns:
        return
    try:
        raw.execute(ADD_REDRIVE)
    except sqlite3.OperationalError as exc:
        # Another writer added it between our look and our ALTER (it cannot, under
        # BEGIN IMMEDIATE, but a tool outside Loom might not take the lock first).
        if "duplicate column name" not in str(exc):
            raise


def _rename_executions(raw: sqlite3.Connection) -> None:
    # Before the tables are created: loom_logs must not exist yet for the rename.
    tables = {row[0] for row in raw.execute(TABLES)}
    if "loom_executions" in tables and "loom_logs" not in tables:
        raw.execute(RENAME_EXECUTIONS)
        raw.execute(RENAME_HEAD)


def _drop_answering_column(raw: sqlite3.Connection) -> None:
    # The index first: SQLite refuses to drop a column an index uses.
    raw.execute(DROP_ANSWERING_INDEX)
    if "answering" in {row[0] for row in raw.execute(EVENT_COLUMNS)}:
        raw.execute(DROP_ANSWERING)


def _current(raw: sqlite3.Connection, path: str) -> bool:
    """True if the file is at :data:`SCHEMA_VERSION`; refuses one past it."""
    version = int(raw.execute(READ_VERSION).fetchone()[0])
    if version > SCHEMA_VERSION:
        raise SchemaTooNewError(path, version, SCHEMA_VERSION)
    return version == SCHEMA_VERSION


def ensure_schema(raw: sqlite3.Connection, path: str) -> bool:
    """Create or migrate the tables of the file at ``path``; True if anything was written.

    Runs on the connection's thread with the connection in autocommit mode. Raises
    :class:`~loom_sqlite.errors.SchemaTooNewError`, writing nothing, for a file a newer
    loom-sqlite migrated.
    """
    if _current(raw, path):
        return False
    raw.execute("BEGIN IMMEDIATE")
    try:
        # Re-read under the write lock: another process may have finished it meanwhile.
        if _current(raw, path):
            raw.execute("ROLLBACK")
            return False
        _rename_executions(raw)
        for statement in _CREATE:
            raw.execute(statement)
        _add_redrive_column(raw)
        _drop_answering_column(raw)
        raw.execute(WRITE_VERSION)
        raw.execute("COMMIT")
    except BaseException:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
        raise
    return True
