"""loom-sharded: route Loom executions over several storages by rendezvous hashing.

Each execution (its log, fence, timers) and each lease lives on the one shard its id
hashes to (:mod:`loom_sharded.routing`); ``list_executions`` and timer ``due`` merge the
shards in one order. Register it by installing the distribution (entry point ``loom``:
``sharded``), then::

    open_storage(url0, decorators=[("sharded", {"shards": [url1, url2]})])
"""

from loom_sharded.errors import (
    CrossShardError,
    Shard,
    ShardLayoutChangedError,
    ShardUnavailableError,
)
from loom_sharded.events import ShardedEventStore
from loom_sharded.layout import LAYOUT_ID
from loom_sharded.leases import ShardedLeaseStore
from loom_sharded.plugin import ShardedDecorator, check_layout, sharded_storage
from loom_sharded.routing import Movement, ShardRouter, default_names, measure_movement
from loom_sharded.timers import ShardedTimerStore

__all__ = [
    "LAYOUT_ID",
    "CrossShardError",
    "Movement",
    "Shard",
    "ShardLayoutChangedError",
    "ShardRouter",
    "ShardUnavailableError",
    "ShardedDecorator",
    "ShardedEventStore",
    "ShardedLeaseStore",
    "ShardedTimerStore",
    "check_layout",
    "default_names",
    "measure_movement",
    "sharded_storage",
]
