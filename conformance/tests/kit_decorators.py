"""Two small decorators the kit's own tests register in-process: one forwarding every
optional method, one implementing some and refusing others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

from loom_core import (
    AppendRequest,
    Event,
    EventStore,
    InvalidOptionError,
    Storage,
    StoreClosedError,
)
from loom_core.decorating import (
    FORWARD,
    Decisions,
    DecoratorRegistry,
    EventStoreDecorator,
    Implement,
    InnerOpener,
    Refuse,
    hookimpl,
)
from loom_core.spi import check_execution_id, check_sequence

__all__ = [
    "FORWARDING",
    "PICKY",
    "ForwardingDecorator",
    "ForwardingEventStore",
    "PickyDecorator",
    "PickyEventStore",
    "loom_register_decorators",
]

FORWARDING = "kit-forwarding"
PICKY = "kit-picky"


class ForwardingEventStore(EventStoreDecorator):
    """Forwards everything: offers exactly what the inner store offers."""

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=FORWARD,
        append_many=FORWARD,
        delete_execution=FORWARD,
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=FORWARD,
    )


class PickyEventStore(EventStoreDecorator):
    """Implements ``subscribe`` itself (polling ``read``, so it works over any inner
    store), counts ``append_many`` (only while the inner offers it), refuses deletion and
    compaction, forwards the rest."""

    def __init__(self, inner: EventStore, *, poll_interval: float) -> None:
        super().__init__(inner)
        self.poll_interval = poll_interval
        self.batches = 0
        self._closed = False

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        self.batches += 1
        return await self.inner.append_many(requests)

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        execution_id = check_execution_id(execution_id)
        from_sequence = check_sequence(from_sequence, "from_sequence")
        if self._closed:
            raise StoreClosedError("this PickyEventStore")
        return self._poll(execution_id, from_sequence)

    async def _poll(self, execution_id: str, next_sequence: int) -> AsyncIterator[Event]:
        while not self._closed:
            batch = await self.inner.read(execution_id, from_sequence=next_sequence)
            for event in batch:
                next_sequence = event.sequence + 1
                yield event
            if not batch:
                await asyncio.sleep(self.poll_interval)

    async def close(self) -> None:
        self._closed = True
        await self.inner.close()

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=FORWARD,
        append_many=Implement(append_many),
        delete_execution=Refuse("picky stores keep every log"),
        copy_prefix=FORWARD,
        truncate_prefix_keeping=Refuse("picky stores never compact"),
        subscribe=Implement(subscribe, requires=()),
    )


class ForwardingDecorator:
    name = FORWARDING

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        if options:
            raise InvalidOptionError(f"{FORWARDING} takes no options, got {sorted(options)}")
        return Storage(
            ForwardingEventStore(storage.events), storage.timers, storage.leases,
            url=storage.url, on_close=storage.close,
        )

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {}


class PickyDecorator:
    name = PICKY

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        unknown = set(options) - {"poll_interval"}
        if unknown:
            raise InvalidOptionError(f"unknown {PICKY} options {sorted(unknown)}")
        interval = options.get("poll_interval", 0.05)
        if not isinstance(interval, int | float) or interval <= 0:
            raise InvalidOptionError("poll_interval must be a positive number of seconds")
        return Storage(
            PickyEventStore(storage.events, poll_interval=float(interval)),
            storage.timers, storage.leases, url=storage.url, on_close=storage.close,
        )

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {"poll_interval": 0.001}


@hookimpl
def loom_register_decorators(registry: DecoratorRegistry) -> None:
    registry.add_decorator(ForwardingDecorator())
    registry.add_decorator(PickyDecorator())
