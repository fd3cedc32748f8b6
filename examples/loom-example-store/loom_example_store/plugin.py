"""The plugin module the ``loom`` entry point names: it registers ``example://``."""

from __future__ import annotations

from collections.abc import Mapping

from loom_core import InvalidOptionError, InvalidURLError, Storage
from loom_core.memory import MemoryLeaseStore, MemoryTimerStore
from loom_core.spi import BackendRegistry, hookimpl
from loom_example_store.store import DictEventStore

__all__ = ["loom_register_backends", "open_example"]


async def open_example(url: str, options: Mapping[str, object]) -> Storage:
    """``example://``: a fresh dict-backed storage. Takes no host, path or options.

    The event store is this plugin's own; timers and leases are borrowed from the
    kernel's in-memory stores to keep the example short (a real backend supplies all
    three, and the kit's timer and lease suites would then test its own).
    """
    if url.rstrip("/") != "example:":
        raise InvalidURLError(f"example URLs take no host or path: use 'example://', not {url!r}")
    if options:
        raise InvalidOptionError(f"example:// takes no options, got {sorted(options)}")
    return Storage(DictEventStore(), MemoryTimerStore(), MemoryLeaseStore(), url=url)


@hookimpl
def loom_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend("example", open_example)
