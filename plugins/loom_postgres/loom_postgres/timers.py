"""The PostgreSQL timer store, in the same database as the log, so one backup holds the
whole kernel state (the rules: docs/design.md, "Timers and re-drives").

``schedule`` upserts with ``redrive = COALESCE(new, old)``: a re-drive row is never
downgraded by a plain schedule of the same (execution, wake_at), and a plain row gains
the flag when a re-drive lands on it. ``due(redrive=False)`` leaves re-drive rows out
*before* the limit, so rows a node cannot judge never starve the plain wakes behind them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Final, cast

from loom_core.errors import InvalidOptionError, StoreClosedError
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    Redrive,
    TimerRecord,
    check_aware,
    check_execution_id,
    check_limit,
    check_timer_record,
)
from loom_postgres.database import Database

__all__ = ["PostgresTimerStore"]

SCHEDULE: Final = """
INSERT INTO loom_timers AS t (execution_id, wake_at, redrive)
VALUES (%s, %s, %s::jsonb)
ON CONFLICT (execution_id, wake_at)
DO UPDATE SET redrive = COALESCE(EXCLUDED.redrive, t.redrive)
"""

DUE: Final = """
SELECT execution_id, wake_at, redrive FROM loom_timers
WHERE wake_at <= %s AND (%s OR redrive IS NULL)
ORDER BY wake_at, execution_id COLLATE "C"
LIMIT %s
"""

PENDING: Final = """
SELECT execution_id, wake_at, redrive FROM loom_timers
WHERE execution_id = %s
ORDER BY wake_at
"""

COMPLETE: Final = "DELETE FROM loom_timers WHERE execution_id = %s AND wake_at = %s RETURNING 1"

CANCEL: Final = """
DELETE FROM loom_timers
WHERE execution_id = %s AND (%s::timestamptz IS NULL OR wake_at = %s::timestamptz)
RETURNING 1
"""


def _redrive(value: object) -> Redrive | None:
    if value is None:
        return None
    data = json.loads(value) if isinstance(value, str) else value
    return Redrive(int(cast(dict[str, int], data)["attempt"]))


class PostgresTimerStore:
    """Durable wake-ups keyed by (execution_id, wake_at)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("this PostgreSQL timer store")

    def _rows(self, rows: list[tuple[object, ...]]) -> tuple[TimerRecord, ...]:
        return tuple(
            TimerRecord(str(e), cast(datetime, w), _redrive(r)) for e, w, r in rows
        )

    async def schedule(self, record: TimerRecord) -> None:
        record = check_timer_record(record)
        self._check_open()
        redrive = None if record.redrive is None else json.dumps(
            {"attempt": record.redrive.attempt}
        )
        # An upsert: running it twice (after a lost connection) is harmless.
        await self._db.fetch(
            SCHEDULE, (record.execution_id, record.wake_at, redrive), what="schedule",
            execution_id=record.execution_id, write=True,
        )

    async def due(
        self, now: datetime, *, limit: int = DEFAULT_LIST_LIMIT, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        now = check_aware(now, "now")
        limit = check_limit(limit)
        if not isinstance(redrive, bool):
            raise InvalidOptionError(f"redrive must be a bool, not {type(redrive).__name__}")
        self._check_open()
        return self._rows(await self._db.fetch(DUE, (now, redrive, limit), what="due"))

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        execution_id = check_execution_id(execution_id)
        self._check_open()
        return self._rows(
            await self._db.fetch(PENDING, (execution_id,), what="pending",
                                 execution_id=execution_id)
        )

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        execution_id = check_execution_id(execution_id)
        wake_at = check_aware(wake_at, "wake_at")
        self._check_open()
        rows = await self._db.fetch(
            COMPLETE, (execution_id, wake_at), what="complete", execution_id=execution_id,
            write=True,
        )
        return bool(rows)

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        execution_id = check_execution_id(execution_id)
        if wake_at is not None:
            wake_at = check_aware(wake_at, "wake_at")
        self._check_open()
        rows = await self._db.fetch(
            CANCEL, (execution_id, wake_at, wake_at), what="cancel", execution_id=execution_id,
            write=True,
        )
        return len(rows)

    async def close(self) -> None:
        self._closed = True
