"""eventsourcing's recorders, opened as its users open them, and what they are given to write.

Imported only when eventsourcing is installed (:mod:`loom_bench.eventsourcing_peer` checks).
Its recorder layer is used directly: a datastore, one recorder over it, ``create_table()``,
then ``insert_events`` of :class:`~eventsourcing.persistence.StoredEvent` values (the
mapper above it, which turns domain events into stored ones, is not run: our side's
payloads are JSON values too, and the stored ``state`` is their JSON, already encoded).

- PostgreSQL: ``PostgresDatastore`` (psycopg 3 with a ``psycopg_pool`` pool of one
  connection per thread, ``pool_size=concurrency, max_overflow=0``) and
  ``PostgresAggregateRecorder`` (one ``INSERT … SELECT FROM unnest(…)`` in autocommit) or
  ``PostgresApplicationRecorder`` (a pipelined transaction that takes ``LOCK TABLE … IN
  EXCLUSIVE MODE``, sends ``NOTIFY`` and inserts, returning the notification ids), text
  originator ids; everything else is the library's default.
- SQLite: ``SQLiteDatastore`` on a file (WAL, which the library sets itself) and
  ``SQLiteAggregateRecorder`` (``executemany`` in one ``BEGIN … COMMIT``, a ``WITHOUT
  ROWID`` table) or ``SQLiteApplicationRecorder`` (one ``INSERT`` per event in one
  transaction, the rowid as notification id). The library leaves ``PRAGMA synchronous``
  at SQLite's default (FULL); it is set here on every connection its pool opens to the
  value our store uses, so both sides make the same durability promise.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

from eventsourcing.persistence import AggregateRecorder, StoredEvent
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
)
from eventsourcing.sqlite import (
    SQLiteAggregateRecorder,
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteDatastore,
)

from loom_bench.eventsourcing_peer import Peer, PostgresPeer, RecorderKind, SqlitePeer
from loom_bench.raw_sqlite import Synchronous
from loom_bench.scenarios import EventTemplate

__all__ = ["TABLES", "Opened", "opened_recorder", "stored_events"]

TABLES: Final[dict[RecorderKind, str]] = {
    "aggregate": "loom_bench_aggregate_events",
    "application": "loom_bench_application_events",
}
# Waiting for a connection behind 63 others on a loaded machine is part of a run, not a
# failure (the library's defaults are 5 s).
POOL_TIMEOUT: Final = 120.0
_SYNCHRONOUS: Final[dict[Synchronous, str]] = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}
_SYNCHRONOUS_NAMES: Final = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
SHOW_DURABILITY: Final = (
    "SELECT name, current_setting(name) AS setting "
    "FROM unnest(%s::text[]) AS name ORDER BY name"
)


@dataclass(frozen=True, slots=True)
class Opened:
    """A recorder ready to write, and the durability settings read back through one of
    its own connections (``synchronous``/``journal_mode``, or ``fsync``/
    ``synchronous_commit``)."""

    recorder: AggregateRecorder
    durability: dict[str, str]


def _state(template: EventTemplate) -> bytes:
    return json.dumps(template.payload, separators=(",", ":")).encode()


def stored_events(
    stream: str, templates: Sequence[EventTemplate], position: int
) -> list[StoredEvent]:
    """``templates`` as stored events of ``stream`` from our ``position`` on (its
    ``originator_version`` is ``position + 1`` for the first: versions count from 1), the
    kind as the topic and the payload's JSON as the state."""
    return [
        StoredEvent(
            originator_id=stream,
            originator_version=position + offset + 1,
            topic=template.kind,
            state=_state(template),
        )
        for offset, template in enumerate(templates)
    ]


class _SynchronousPool(SQLiteConnectionPool):
    """The library's pool, with ``PRAGMA synchronous`` set on each connection it opens
    (a per-connection setting: the pool is the one place every connection passes)."""

    def __init__(self, *, synchronous: Synchronous, db_name: str, pool_size: int) -> None:
        self._synchronous = _SYNCHRONOUS[synchronous]
        super().__init__(
            db_name=db_name, pool_size=pool_size, max_overflow=0, pool_timeout=POOL_TIMEOUT
        )

    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        connection.cursor().execute(self._synchronous)
        return connection


@contextlib.contextmanager
def _sqlite(peer: SqlitePeer, kind: RecorderKind, pool_size: int) -> Iterator[Opened]:
    datastore = SQLiteDatastore(
        str(peer.path), pool_size=pool_size, max_overflow=0, pool_timeout=POOL_TIMEOUT,
        originator_id_type="text",
    )
    datastore.pool.close()  # never opened a connection: replaced before first use
    datastore.pool = _SynchronousPool(
        synchronous=peer.synchronous, db_name=str(peer.path), pool_size=pool_size
    )
    try:
        recorder: AggregateRecorder
        if kind == "aggregate":
            recorder = SQLiteAggregateRecorder(datastore, TABLES[kind])
        else:
            recorder = SQLiteApplicationRecorder(datastore, TABLES[kind])
        recorder.create_table()
        with datastore.get_connection(commit=False) as connection:
            cursor = connection.cursor()
            cursor.execute("PRAGMA synchronous")
            synchronous = _SYNCHRONOUS_NAMES.get(int(cursor.fetchone()[0]), "?")
            cursor.execute("PRAGMA journal_mode")
            journal_mode = str(cursor.fetchone()[0])
        yield Opened(recorder, {"synchronous": synchronous, "journal_mode": journal_mode})
    finally:
        datastore.close()


@contextlib.contextmanager
def _postgres(peer: PostgresPeer, kind: RecorderKind, pool_size: int) -> Iterator[Opened]:
    parts = urlsplit(peer.url)
    datastore = PostgresDatastore(
        dbname=unquote(parts.path.lstrip("/")) or "postgres",
        host=parts.hostname or "",
        port=parts.port or 5432,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        pool_size=pool_size,
        max_overflow=0,
        connect_timeout=POOL_TIMEOUT,
        originator_id_type="text",
    )
    try:
        recorder: AggregateRecorder
        if kind == "aggregate":
            recorder = PostgresAggregateRecorder(datastore, events_table_name=TABLES[kind])
        else:
            recorder = PostgresApplicationRecorder(datastore, events_table_name=TABLES[kind])
        recorder.create_table()
        # Every connection of the pool is open before the clock starts.
        datastore.pool.wait(timeout=POOL_TIMEOUT)
        with datastore.get_connection() as connection:
            rows = connection.execute(
                SHOW_DURABILITY, (["fsync", "synchronous_commit"],)
            ).fetchall()
        durability = {str(row["name"]): str(row["setting"]) for row in rows}
        yield Opened(recorder, durability)
    finally:
        datastore.close()


@contextlib.contextmanager
def opened_recorder(peer: Peer, kind: RecorderKind, pool_size: int) -> Iterator[Opened]:
    """eventsourcing's ``kind`` recorder on ``peer``, its table created, with a pool of
    ``pool_size`` connections; closed on exit."""
    if kind not in TABLES:
        raise ValueError(f"recorder must be one of {', '.join(TABLES)}, got {kind!r}")
    if isinstance(peer, SqlitePeer):
        with _sqlite(peer, kind, pool_size) as opened:
            yield opened
    else:
        with _postgres(peer, kind, pool_size) as opened:
            yield opened
