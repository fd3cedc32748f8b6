"""Registers the built-in ``memory://`` backend."""

from __future__ import annotations

from collections.abc import Mapping

from loom_core.errors import InvalidOptionError, InvalidURLError
from loom_core.hookspecs import hookimpl
from loom_core.memory.events import MemoryEventStore
from loom_core.memory.leases import MemoryLeaseStore
from loom_core.memory.timers import MemoryTimerStore
from loom_core.registry import BackendRegistry
from loom_core.storage import Storage

__all__ = ["loom_register_backends", "open_memory"]


async def open_memory(url: str, options: Mapping[str, object]) -> Storage:
    """``memory://``: a fresh, process-local storage. Options: ``offer`` (the optional
    methods the event store offers; default all)."""
    if url.lower() != "memory://":  # a scheme is case-insensitive
        raise InvalidURLError(f"memory URLs take no host or path: use 'memory://', not {url!r}")
    unknown = set(options) - {"offer"}
    if unknown:
        raise InvalidOptionError(f"unknown memory:// options {sorted(unknown)}; known: offer")
    offer = options.get("offer")
    events = MemoryEventStore(offer=offer) if offer is not None else MemoryEventStore()  # type: ignore[arg-type]
    return Storage(events, MemoryTimerStore(), MemoryLeaseStore(), url=url)


@hookimpl
def loom_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend("memory", open_memory)
