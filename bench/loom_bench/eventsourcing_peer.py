"""eventsourcing as a peer of the stream rows: its recorders writing what ours writes.

eventsourcing (``pip install 'loom-bench[eventsourcing]'``, version 9.5.6) is a
synchronous library, so it is driven as its users drive it: a pool of ``concurrency``
threads, each calling the recorder's ``insert_events`` for one stream after another
(:func:`loom_bench.drive.drive_threads`), the whole run in a worker thread while the event
loop draws the progress line. Each run opens a fresh datastore and recorder
(:mod:`loom_bench.eventsourcing_recorders`: table creation and the pool's connections are
outside the clock), warms up, writes the untimed setup of an append row, runs
``executions`` timed writes and closes the datastore again.

Two recorders beside each row, in the same repetitions as ours:

- ``aggregate``: the aggregate recorder, which inserts the events and nothing else;
- ``application``: the application recorder (what an ``Application`` uses), which also
  numbers every event in one sequence for its notification log and, on PostgreSQL, takes
  an exclusive lock on its table for that (its writers go one at a time).

On PostgreSQL they write into a database of their own on the server our rows use
(``<database>_loom_bench_eventsourcing``), vacuumed between runs like ours; on SQLite,
into a fresh file per run in the bench's working directory, like ours.
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from loom_bench.drive import RunPlan, Tick, drive_threads
from loom_bench.raw_sqlite import Synchronous
from loom_bench.statistics import Sample
from loom_bench.streams import StreamScenario

__all__ = [
    "EVENTSOURCING_INSTALL",
    "EVENTSOURCING_LABEL",
    "EVENTSOURCING_VERSION",
    "RECORDERS",
    "Peer",
    "PeerRun",
    "PostgresPeer",
    "RecorderKind",
    "SqlitePeer",
    "eventsourcing_missing",
    "measure_eventsourcing",
    "recorder_label",
    "run_eventsourcing",
]

EVENTSOURCING_LABEL: Final = "eventsourcing"
EVENTSOURCING_VERSION: Final = "9.5.6"
EVENTSOURCING_INSTALL: Final = "pip install 'loom-bench[eventsourcing]'"

RecorderKind = Literal["aggregate", "application"]
RECORDERS: Final[tuple[RecorderKind, ...]] = ("aggregate", "application")


@dataclass(frozen=True, slots=True)
class SqlitePeer:
    """eventsourcing on the SQLite file ``path``, with ``synchronous`` as ours."""

    path: Path
    synchronous: Synchronous = "NORMAL"


@dataclass(frozen=True, slots=True)
class PostgresPeer:
    """eventsourcing on the PostgreSQL database at ``url`` (its host, port, user,
    password and database name: what ``POSTGRES_HOST`` … ``POSTGRES_DBNAME`` give it)."""

    url: str


Peer = SqlitePeer | PostgresPeer


def eventsourcing_missing() -> str | None:
    """None when eventsourcing (with psycopg_pool, for its PostgreSQL recorders) is
    importable, else what to install."""
    if any(importlib.util.find_spec(name) is None for name in ("eventsourcing", "psycopg_pool")):
        return EVENTSOURCING_INSTALL
    return None


def recorder_label(kind: RecorderKind) -> str:
    """The side's name in the report, e.g. ``eventsourcing application``."""
    return f"{EVENTSOURCING_LABEL} {kind}"


@dataclass(frozen=True, slots=True)
class PeerRun:
    """One timed run, and the durability settings read back through the peer's own
    connection during it."""

    sample: Sample
    durability: dict[str, str]


def run_eventsourcing(
    peer: Peer, kind: RecorderKind, scenario: StreamScenario, plan: RunPlan, tick: Tick
) -> PeerRun:
    """One timed run of ``scenario`` through the ``kind`` recorder, in this thread (the
    writes themselves on a pool of ``plan.concurrency`` threads)."""
    from loom_bench.eventsourcing_recorders import opened_recorder, stored_events

    position = scenario.position
    with opened_recorder(peer, kind, plan.concurrency) as opened:
        insert = opened.recorder.insert_events

        def warm(index: int) -> None:
            stream = plan.warmup_id(index)
            if scenario.setup:
                insert(stored_events(stream, scenario.setup, 0))
            insert(stored_events(stream, scenario.events, position))

        def set_up(index: int) -> None:
            insert(stored_events(plan.execution_id(index), scenario.setup, 0))

        # Built before the clock, as our side's events are: a user's mapper would build
        # them inside it, so this favours eventsourcing.
        batches = [
            stored_events(plan.execution_id(index), scenario.events, position)
            for index in range(plan.executions)
        ]

        def timed(index: int) -> None:
            insert(batches[index])

        if plan.warmup:
            drive_threads(plan.warmup, plan.concurrency, warm)
        if scenario.setup:
            drive_threads(plan.executions, plan.concurrency, set_up)
        sample = drive_threads(plan.executions, plan.concurrency, timed, tick)
        return PeerRun(sample, opened.durability)


async def measure_eventsourcing(
    peer: Peer, kind: RecorderKind, scenario: StreamScenario, plan: RunPlan, tick: Tick
) -> PeerRun:
    """:func:`run_eventsourcing` in a worker thread, so the event loop keeps running."""
    return await asyncio.to_thread(run_eventsourcing, peer, kind, scenario, plan, tick)
