"""The tenant-scoped timer store."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

from loom_core.errors import InvalidOptionError, StoreClosedError
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    TimerRecord,
    TimerStore,
    check_aware,
    check_limit,
    check_timer_record,
)
from loom_tenant.codec import TenantCodec
from loom_tenant.scrubbing import tenant_errors

__all__ = ["TenantTimerStore"]


class TenantTimerStore:
    """One tenant's timer rows in a shared inner :class:`~loom_core.spi.TimerStore`.

    Rows are keyed by the encoded execution id, so ``pending``, ``complete`` and
    ``cancel`` reach only the tenant's rows. ``due`` has no prefix filter in the SPI: it
    asks the inner store for due rows in growing batches and keeps the tenant's, so its
    cost grows with the rows of *other* tenants that are due ahead of this one's (the
    order and the ``redrive=False`` exclusion are the inner store's, applied before the
    tenant's ``limit``).
    """

    def __init__(self, inner: TimerStore, tenant: str, *, owns_inner: bool = True) -> None:
        self.inner = inner
        self.codec = TenantCodec(tenant)
        self._owns_inner = owns_inner
        self._closed = False

    @property
    def tenant(self) -> str:
        return self.codec.tenant

    def _restore(self, record: TimerRecord) -> TimerRecord | None:
        raw = self.codec.decode(record.execution_id)
        return None if raw is None else TimerRecord(raw, record.wake_at, record.redrive)

    async def schedule(self, record: TimerRecord) -> None:
        record = check_timer_record(record)
        stored = TimerRecord(self.codec.encode(record.execution_id), record.wake_at, record.redrive)
        with self._errors(record.execution_id):
            await self.inner.schedule(stored)

    async def due(
        self, now: datetime, *, limit: int = DEFAULT_LIST_LIMIT, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        now = check_aware(now, "now")
        limit = check_limit(limit)
        if not isinstance(redrive, bool):
            raise InvalidOptionError(f"redrive must be a bool, not {type(redrive).__name__}")
        batch = limit
        while True:
            with self._errors():
                rows = await self.inner.due(now, limit=batch, redrive=redrive)
            mine = [r for r in map(self._restore, rows) if r is not None]
            if len(mine) >= limit or len(rows) < batch:
                return tuple(mine[:limit])
            batch *= 4

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        stored = self.codec.encode(execution_id)
        with self._errors(execution_id):
            rows = await self.inner.pending(stored)
        return tuple(r for r in map(self._restore, rows) if r is not None)

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        stored = self.codec.encode(execution_id)
        wake_at = check_aware(wake_at, "wake_at")
        with self._errors(execution_id):
            return await self.inner.complete(stored, wake_at)

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        stored = self.codec.encode(execution_id)
        if wake_at is not None:
            wake_at = check_aware(wake_at, "wake_at")
        with self._errors(execution_id):
            return await self.inner.cancel(stored, wake_at)

    async def close(self) -> None:
        """Refuse every later call; close the inner store too if this view owns it."""
        if self._closed:
            return
        self._closed = True
        if self._owns_inner:
            await self.inner.close()

    def _errors(self, *raw_ids: str) -> AbstractContextManager[None]:
        """The scrubbing scope of one call to the inner store, once it is known to be open:
        a closed view refuses even while the store it shares stays open for others."""
        if self._closed:
            raise StoreClosedError(f"tenant {self.tenant!r}'s view of the timer store")
        return tenant_errors(self.codec, *raw_ids)
