"""In-memory stores: the embedded default (``memory://``) and the reference for the kit."""

from loom_core.memory.events import MemoryEventStore
from loom_core.memory.leases import MemoryLeaseStore
from loom_core.memory.timers import MemoryTimerStore

__all__ = ["MemoryEventStore", "MemoryLeaseStore", "MemoryTimerStore"]
