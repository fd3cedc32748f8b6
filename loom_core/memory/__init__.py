"""In-memory stores: the embedded default (``memory://``) and the reference for the kit.

:func:`open_memory` is the ``memory://`` backend factory itself, for a plugin or a test
that registers a scheme of its own over fresh in-memory storage.
"""

from loom_core.memory.events import MemoryEventStore
from loom_core.memory.leases import MemoryLeaseStore
from loom_core.memory.plugin import open_memory
from loom_core.memory.timers import MemoryTimerStore

__all__ = ["MemoryEventStore", "MemoryLeaseStore", "MemoryTimerStore", "open_memory"]
