"""The sharded timer store: rows live on the shard that owns their execution."""

from __future__ import annotations

import heapq
import logging
from datetime import datetime

from loom_core.errors import InvalidOptionError
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    TimerRecord,
    TimerStore,
    check_aware,
    check_limit,
    check_timer_record,
)
from loom_sharded.errors import ShardUnavailableError
from loom_sharded.placement import Placement, on_shard

__all__ = ["ShardedTimerStore"]

logger = logging.getLogger("loom_sharded")


def _order(record: TimerRecord) -> tuple[datetime, str]:
    return record.wake_at, record.execution_id


class ShardedTimerStore:
    """``schedule``, ``pending``, ``complete`` and ``cancel`` go to the execution's shard.

    ``due`` merges every shard's first ``limit`` due rows in (wake_at, execution_id)
    order and keeps ``limit``. A shard that is down is *skipped* by ``due`` (logged at
    WARNING on the ``loom_sharded`` logger as the first call skips it, at INFO as it
    answers again, at DEBUG between; kept in :attr:`unavailable`): its rows stay
    in place and are due again on the next poll once it is back, while the other shards'
    wakes keep firing. Unlike ``list_executions``, ``due`` has no cursor that would skip
    the missing rows for good. When *no* shard answers, ``due`` raises the first shard's
    error instead of reporting that nothing is due.
    """

    def __init__(self, placement: Placement[TimerStore]) -> None:
        self.placement = placement
        self.unavailable: tuple[ShardUnavailableError, ...] = ()
        """The shards the last ``due`` call had to skip."""

    async def schedule(self, record: TimerRecord) -> None:
        record = check_timer_record(record)
        _, store, shard = self.placement.route(record.execution_id)
        with on_shard(shard, record.execution_id):
            await store.schedule(record)

    async def due(
        self, now: datetime, *, limit: int = DEFAULT_LIST_LIMIT, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        now = check_aware(now, "now")
        limit = check_limit(limit)
        if not isinstance(redrive, bool):
            raise InvalidOptionError(f"redrive must be a bool, not {type(redrive).__name__}")
        results = await self.placement.each(
            lambda store: store.due(now, limit=limit, redrive=redrive)
        )
        pages: list[tuple[TimerRecord, ...]] = []
        skipped: list[ShardUnavailableError] = []
        for result in results:
            if isinstance(result, ShardUnavailableError):
                skipped.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                pages.append(result)
        self._say_changes(skipped)
        self.unavailable = tuple(skipped)
        if not pages:
            # Nothing answered: an empty result would read as "nothing is due".
            raise skipped[0]
        merged = heapq.merge(*pages, key=_order)
        return tuple(record for _, record in zip(range(limit), merged, strict=False))

    def _say_changes(self, skipped: list[ShardUnavailableError]) -> None:
        """Log a shard going down (WARNING) and coming back (INFO), not each poll that
        skips it (a timer service polls four times a second): those go to DEBUG."""
        before = {error.shard.index: error for error in self.unavailable}
        now = {error.shard.index for error in skipped}
        for error in skipped:
            if error.shard.index in before:
                logger.debug("due() skipped a shard again: %s", error)
            else:
                logger.warning("due() skipped a shard: %s", error)
        for index, error in before.items():
            if index not in now:
                logger.info("due() reads %s again: it answers again", error.shard)

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.pending(execution_id)

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        wake_at = check_aware(wake_at, "wake_at")
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.complete(execution_id, wake_at)

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        if wake_at is not None:
            wake_at = check_aware(wake_at, "wake_at")
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.cancel(execution_id, wake_at)

    async def close(self) -> None:
        await self.placement.close_all(lambda store: store.close())

    def shard_of(self, execution_id: str) -> int:
        return self.placement.index_of(execution_id)


