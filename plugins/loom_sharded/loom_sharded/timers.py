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
    WARNING on the ``loom_sharded`` logger and kept in :attr:`unavailable`): its rows stay
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
                logger.warning("due() skipped a shard: %s", result)
                skipped.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                pages.append(result)
        self.unavailable = tuple(skipped)
        if not pages:
            # Nothing answered: an empty result would read as "nothing is due".
            raise skipped[0]
        merged = heapq.merge(*pages, key=_order)
        return tuple(record for _, record in zip(range(limit), merged, strict=False))

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.pending(execution_id)

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.complete(execution_id, wake_at)

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        execution_id, store, shard = self.placement.route(execution_id)
        with on_shard(shard, execution_id):
            return await store.cancel(execution_id, wake_at)

    async def close(self) -> None:
        await self.placement.close_all(lambda store: store.close())

    def shard_of(self, execution_id: str) -> int:
        return self.placement.index_of(execution_id)


