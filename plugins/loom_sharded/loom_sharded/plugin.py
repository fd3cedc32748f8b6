"""The ``sharded`` decorator plugin and :func:`sharded_storage`.

::

    storage = await open_storage(
        "postgresql://db0/loom",
        decorators=[("sharded", {"shards": ["postgresql://db1/loom", "postgresql://db2/loom"]})],
    )

The decorated storage is shard 0; ``shards`` adds the others, as URLs (opened here with
the installed backends) or as open :class:`~loom_core.Storage` objects. The result
owns every shard: closing it closes them all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, final

from loom_core import Storage, open_storage
from loom_core.decorating import (
    DecoratorRegistry,
    EventStoreDecorator,
    InnerOpener,
    hookimpl,
)
from loom_core.errors import InvalidOptionError
from loom_core.spi import EventStore, LeaseStore, TimerStore
from loom_sharded.errors import Shard, redact_url
from loom_sharded.events import ShardedEventStore
from loom_sharded.layout import check_records
from loom_sharded.leases import ShardedLeaseStore
from loom_sharded.placement import Placement
from loom_sharded.routing import ShardRouter, default_names
from loom_sharded.timers import ShardedTimerStore

__all__ = ["ShardedDecorator", "check_layout", "loom_register_decorators", "sharded_storage"]

OPTIONS: Final = frozenset({"shards", "names", "colocate"})
CONFORMANCE_EXTRA_SHARDS: Final = 2
"""The kit runs through three shards: the store under test and two more of its kind."""
CONFORMANCE_COLOCATE: Final = "-"
"""The kit's multi-execution cases (``append_many`` of ``exec-a`` and ``exec-b``, a
``copy_prefix`` of ``exec-src`` to ``exec-branch``) need their ids on one shard, which is
what co-location is for: with ``-`` they share the stem ``exec``. Ids with other stems
(``job-1``, ``page-…``, ``copy-target``, lease keys) still spread over the shards; the
plugin's own tests also run the kit with plain routing, where only those cases are left
out, and test their cross-shard refusal instead."""


def _names(names: object, count: int) -> tuple[str, ...]:
    if names is None:
        return default_names(count)
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InvalidOptionError("names must be a list of str, one per shard (shard 0 first)")
    if len(names) != count:
        raise InvalidOptionError(
            f"names has {len(names)} entries but there are {count} shards (the decorated "
            "storage is shard 0, then each of 'shards')"
        )
    return tuple(ShardRouter(names).names)


def sharded_storage(
    shards: Sequence[Storage],
    *,
    names: Sequence[str] | None = None,
    colocate: str | None = None,
) -> Storage:
    """One :class:`Storage` over ``shards`` (which it owns: closing it closes each).

    ``names`` are the shards' routing names (default ``shard-0``, ``shard-1``, …): an id's
    owner depends on them, not on the list order, so name shards when the list may be
    reordered. ``colocate`` is a separator: ids with the same stem before it share a shard
    (:mod:`loom_sharded.routing`).

    Refuses (:class:`~loom_core.errors.InvalidOptionError`) an empty list, a storage given
    twice, names that are not one unique printable str per shard, a bad ``colocate``,
    shards decorated differently, and shards whose event stores do not offer the same
    optional methods.

    Await :func:`check_layout` on the result before using it: it records the layout on a
    first open and refuses one that changed since (the ``sharded`` decorator does it).
    """
    if isinstance(shards, str) or not isinstance(shards, Sequence) or not shards:
        raise InvalidOptionError("sharded_storage needs a non-empty list of Storage")
    for i, shard in enumerate(shards):
        if not isinstance(shard, Storage):
            raise InvalidOptionError(f"shard {i} is a {type(shard).__name__}, not a Storage")
    if len({id(shard) for shard in shards}) != len(shards):
        raise InvalidOptionError("the same Storage is given as two shards")
    if colocate is not None and not isinstance(colocate, str):
        raise InvalidOptionError(f"colocate must be a str, not {type(colocate).__name__}")
    _check_same_layers(shards)
    router = ShardRouter(_names(names, len(shards)), colocate=colocate)
    info = [Shard(i, name, redact_url(s.url)) for i, (name, s) in
            enumerate(zip(router.names, shards, strict=True))]
    events = ShardedEventStore([s.events for s in shards], router=router, shard_info=info)
    timers = ShardedTimerStore(
        Placement[TimerStore]([s.timers for s in shards], router, info, "the sharded timer store")
    )
    leases = ShardedLeaseStore(
        Placement[LeaseStore]([s.leases for s in shards], router, info, "the sharded lease store")
    )

    async def close_shards() -> None:
        await Placement[Storage](shards, router, info).close_all(lambda s: s.close())

    url = "sharded(" + ", ".join(shard.url or "?" for shard in info) + ")"
    return Storage(events, timers, leases, url=url, on_close=close_shards)


async def check_layout(storage: Storage) -> None:
    """Record the layout of a sharded ``storage`` on its first open; refuse a changed one.

    On the first open every shard gets a record of the shard names, its own name and
    ``colocate`` (:mod:`loom_sharded.layout`); each later call reads them back. Raises
    :class:`~loom_sharded.errors.ShardLayoutChangedError` (nothing written) when a shard was
    added, removed or renamed, default-named shards were reordered, ``colocate`` changed,
    or one database is given as two shards. A shard that is down is skipped with a WARNING
    (the others open and serve their executions); with every shard down, or no shard that
    answers holding a record while one is down, the first down one's
    :class:`~loom_sharded.errors.ShardUnavailableError` is raised. One read per shard;
    appends never look at the record.
    """
    if not isinstance(storage, Storage) or not isinstance(storage.events, ShardedEventStore):
        raise InvalidOptionError("check_layout needs a storage made by sharded_storage")
    await check_records(storage.events.placement)


def _layers(storage: Storage) -> tuple[str, ...]:
    """The decorators of ``storage``'s event store, outermost first, down to its backend
    or to a fan-out of its own (which ends the walk)."""
    found: list[str] = []
    store: EventStore = storage.events
    while isinstance(store, EventStoreDecorator):
        found.append(type(store).__name__)
        if len(store.wrapped) != 1:
            break
        store = store.wrapped[0]
    return tuple(found)


def _check_same_layers(shards: Sequence[Storage]) -> None:
    """Refuse shards decorated differently: a layer on one shard only (a tenant's
    isolation, a cipher, an audit chain) would serve only the ids routed to it."""
    first = _layers(shards[0])
    for i, shard in enumerate(shards[1:], start=1):
        layers = _layers(shard)
        if layers != first:
            raise InvalidOptionError(
                f"shard 0 is decorated with {list(first) or 'nothing'} and shard {i} with "
                f"{list(layers) or 'nothing'}: a layer below the sharded store must be on "
                "every shard, or it serves only the ids routed to that one. Put 'sharded' "
                "first in decorators=[...] (innermost) and the other decorators after it, "
                "so they wrap every shard; or give each shard as a Storage opened with the "
                "same decorators"
            )


@final
class ShardedDecorator:
    """``sharded``: options ``shards`` (required: a list of URLs or open Storage objects,
    the shards after the decorated one), ``names`` (optional routing names, one per
    shard, shard 0 first) and ``colocate`` (optional separator: ids with the same stem
    before it share a shard)."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return "sharded"

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        if not isinstance(storage, Storage):
            raise InvalidOptionError(f"sharded decorates a Storage, not {type(storage).__name__}")
        if not isinstance(options, Mapping):
            raise InvalidOptionError(
                f"sharded options must be a mapping, not {type(options).__name__}"
            )
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise InvalidOptionError(
                f"unknown sharded option(s) {unknown}; known: colocate, names, shards"
            )
        if "shards" not in options:
            raise InvalidOptionError(
                "the sharded decorator needs the option 'shards': the storages after the "
                "decorated one, as URLs or Storage objects"
            )
        extra = options["shards"]
        if isinstance(extra, str) or not isinstance(extra, Sequence):
            raise InvalidOptionError(
                "shards must be a list of URLs or Storage objects, not "
                f"{type(extra).__name__}"
            )
        urls = [item for item in extra if isinstance(item, str)]
        if len(set(urls)) != len(urls):
            raise InvalidOptionError("the same URL is given as two shards")
        for i, item in enumerate(extra, start=1):
            if not isinstance(item, Storage | str):
                raise InvalidOptionError(
                    f"shard {i} is a {type(item).__name__}; give a URL or an open Storage"
                )
            if (
                isinstance(item, str)
                and item == storage.url
                and not item.startswith("memory:")  # each opening is a store of its own
            ):
                raise InvalidOptionError(
                    f"shard {i}, {item!r}, is the decorated storage itself (shard 0): its "
                    "executions would be listed twice"
                )
        names = _names(options.get("names"), 1 + len(extra))
        colocate = options.get("colocate")
        if colocate is not None and not isinstance(colocate, str):
            raise InvalidOptionError(f"colocate must be a str, not {type(colocate).__name__}")
        opened: list[Storage] = []
        try:
            shards = [storage]
            for item in extra:
                if isinstance(item, str):
                    shard = await open_storage(item)
                    opened.append(shard)
                    shards.append(shard)
                else:
                    assert isinstance(item, Storage)
                    shards.append(item)
            sharded = sharded_storage(shards, names=names, colocate=colocate)
            await check_layout(sharded)
            return sharded
        except BaseException:
            # Only what we opened: the caller still owns what it handed in.
            for shard in opened:
                await shard.close()
            raise

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {
            "shards": [await open_inner() for _ in range(CONFORMANCE_EXTRA_SHARDS)],
            "colocate": CONFORMANCE_COLOCATE,
        }


@hookimpl
def loom_register_decorators(registry: DecoratorRegistry) -> None:
    registry.add_decorator(ShardedDecorator())


