"""The SQLite timer store: durable wake-ups keyed by (execution_id, wake_at).

``schedule`` is an upsert that never downgrades a re-drive row and never lets a plain
schedule clear one: ``redrive = COALESCE(new, old)``. ``due(redrive=False)`` excludes
re-drive rows in the ``WHERE`` clause, so *before* the ``LIMIT``: a batch of rows a node
cannot judge never starves the plain wakes behind it. ``wake_at`` is stored as INTEGER
microseconds (exact, ordered); ``redrive`` as JSON text (``{"attempt": n}``), the column
an older file lacks and :mod:`loom_sqlite.schema` adds when it is opened.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from datetime import datetime
from typing import Final

from loom_core.errors import InvalidOptionError
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    Redrive,
    TimerRecord,
    canonical_json,
    check_aware,
    check_execution_id,
    check_limit,
    check_timer_record,
)
from loom_sqlite.clock import from_micros, to_micros
from loom_sqlite.errors import DatabaseClosedError
from loom_sqlite.transactions import TransactionRunner

__all__ = ["SqliteTimerStore"]

UPSERT_TIMER: Final = """
INSERT INTO loom_timers (execution_id, wake_at, redrive) VALUES (?, ?, ?)
ON CONFLICT (execution_id, wake_at)
DO UPDATE SET redrive = COALESCE(excluded.redrive, loom_timers.redrive)
"""
DUE: Final = """
SELECT execution_id, wake_at, redrive FROM loom_timers
WHERE wake_at <= ?
ORDER BY wake_at, execution_id
LIMIT ?
"""
DUE_PLAIN: Final = """
SELECT execution_id, wake_at, redrive FROM loom_timers
WHERE wake_at <= ? AND redrive IS NULL
ORDER BY wake_at, execution_id
LIMIT ?
"""
PENDING: Final = """
SELECT execution_id, wake_at, redrive FROM loom_timers
WHERE execution_id = ?
ORDER BY wake_at
"""
DELETE_ONE: Final = "DELETE FROM loom_timers WHERE execution_id = ? AND wake_at = ?"
DELETE_ALL: Final = "DELETE FROM loom_timers WHERE execution_id = ?"


def _record(execution_id: str, wake_at: int, redrive: str | None) -> TimerRecord:
    flag = None if redrive is None else Redrive(int(json.loads(redrive)["attempt"]))
    return TimerRecord(execution_id, from_micros(wake_at), flag)


def _rows(raw: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> tuple[TimerRecord, ...]:
    return tuple(_record(*row) for row in raw.execute(sql, params))


def _changed(raw: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> int:
    return raw.execute(sql, params).rowcount


class SqliteTimerStore:
    """Timer rows in the storage's SQLite file."""

    def __init__(self, runner: TransactionRunner) -> None:
        self._runner = runner
        self._closed = False

    def _open(self) -> TransactionRunner:
        if self._closed:
            raise DatabaseClosedError(self._runner.path)
        return self._runner

    async def schedule(self, record: TimerRecord) -> None:
        record = check_timer_record(record)
        redrive = (
            None
            if record.redrive is None
            else canonical_json({"attempt": record.redrive.attempt})
        )
        params = (record.execution_id, to_micros(record.wake_at), redrive)
        await self._open().write(
            functools.partial(_changed, sql=UPSERT_TIMER, params=params),
            doing=f"scheduling a timer for {record.execution_id!r}",
            one_statement=True,
        )

    async def due(
        self, now: datetime, *, limit: int = DEFAULT_LIST_LIMIT, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        now = check_aware(now, "now")
        limit = check_limit(limit)
        if not isinstance(redrive, bool):
            raise InvalidOptionError(f"redrive must be a bool, not {type(redrive).__name__}")
        return await self._open().read(
            functools.partial(
                _rows,
                sql=DUE if redrive else DUE_PLAIN,
                params=(to_micros(now), limit),
            ),
            doing="reading due timers",
        )

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        execution_id = check_execution_id(execution_id)
        return await self._open().read(
            functools.partial(_rows, sql=PENDING, params=(execution_id,)),
            doing=f"reading the timers of {execution_id!r}",
        )

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        execution_id = check_execution_id(execution_id)
        wake_at = check_aware(wake_at, "wake_at")
        removed = await self._open().write(
            functools.partial(_changed, sql=DELETE_ONE, params=(execution_id, to_micros(wake_at))),
            doing=f"completing a timer of {execution_id!r}",
            one_statement=True,
        )
        return removed > 0

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        execution_id = check_execution_id(execution_id)
        params: tuple[object, ...]
        if wake_at is None:
            sql, params = DELETE_ALL, (execution_id,)
        else:
            sql, params = DELETE_ONE, (execution_id, to_micros(check_aware(wake_at, "wake_at")))
        return await self._open().write(
            functools.partial(_changed, sql=sql, params=params),
            doing=f"cancelling timers of {execution_id!r}",
            one_statement=True,
        )

    async def close(self) -> None:
        self._closed = True
