"""In-memory timer store, the reference for the SQL stores (see
docs/design.md, "Timers and re-drives")."""

from __future__ import annotations

import heapq
from datetime import datetime

from loom_core.errors import InvalidOptionError, StoreClosedError
from loom_core.memory.turns import YIELD_EVERY, one_turn
from loom_core.protocols import DEFAULT_LIST_LIMIT, Redrive, TimerRecord
from loom_core.validation import (
    check_aware,
    check_execution_id,
    check_limit,
    check_timer_record,
)

__all__ = ["MemoryTimerStore"]


class MemoryTimerStore:
    """Rows keyed by (execution_id, wake_at); ``schedule`` upserts with coalesce."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, datetime], Redrive | None] = {}
        # Each execution's wake instants, so that its rows are found without a pass over
        # every execution's (``pending`` and ``cancel`` run as executions park and end).
        self._by_execution: dict[str, set[datetime]] = {}
        self._closed = False
        self._turns = 1  # calls left until the next yield: the first call yields

    async def schedule(self, record: TimerRecord) -> None:
        record = check_timer_record(record)
        await self._tick()
        key = (record.execution_id, record.wake_at)
        # A plain schedule never clears a re-drive flag; a flagged one replaces it.
        self._rows[key] = record.redrive or self._rows.get(key)
        self._by_execution.setdefault(record.execution_id, set()).add(record.wake_at)

    async def due(
        self, now: datetime, *, limit: int = DEFAULT_LIST_LIMIT, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        now = check_aware(now, "now")
        limit = check_limit(limit)
        if not isinstance(redrive, bool):
            raise InvalidOptionError(f"redrive must be a bool, not {type(redrive).__name__}")
        await self._tick()
        rows = heapq.nsmallest(
            limit,
            (
                (wake_at, execution_id)
                for (execution_id, wake_at), flag in self._rows.items()
                if wake_at <= now and (redrive or flag is None)
            ),
        )
        return tuple(TimerRecord(e, w, self._rows[e, w]) for w, e in rows)

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        execution_id = check_execution_id(execution_id)
        await self._tick()
        return tuple(
            TimerRecord(execution_id, w, self._rows[execution_id, w])
            for w in sorted(self._by_execution.get(execution_id, ()))
        )

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        execution_id = check_execution_id(execution_id)
        wake_at = check_aware(wake_at, "wake_at")
        await self._tick()
        if self._rows.pop((execution_id, wake_at), _MISSING) is _MISSING:
            return False
        self._forget(execution_id, {wake_at})
        return True

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        execution_id = check_execution_id(execution_id)
        if wake_at is not None:
            wake_at = check_aware(wake_at, "wake_at")
        await self._tick()
        held = self._by_execution.get(execution_id, set())
        doomed = set(held) if wake_at is None else held & {wake_at}
        for at in doomed:
            del self._rows[execution_id, at]
        self._forget(execution_id, doomed)
        return len(doomed)

    def _forget(self, execution_id: str, instants: set[datetime]) -> None:
        held = self._by_execution.get(execution_id)
        if held is not None:
            held -= instants
            if not held:
                del self._by_execution[execution_id]

    async def close(self) -> None:
        self._closed = True

    async def _tick(self) -> None:
        # A yield every YIELD_EVERY calls (loom_core.memory.turns). Closed is checked on
        # both sides of the yield, so a call that raced close() is refused too.
        if self._closed:
            raise StoreClosedError('this in-memory timer store')
        self._turns -= 1
        if not self._turns:
            self._turns = YIELD_EVERY
            await one_turn()
            if self._closed:
                raise StoreClosedError('this in-memory timer store')


_MISSING = object()
