"""Walking a decorated stack: the layer every call passes through, every branch's layer,
and the stores at the bottom.

A decorator names every store it wraps in :attr:`EventStoreDecorator.wrapped`:
``(inner,)`` for one that wraps one store, every branch for a *fan-out* (the sharded
decorator wraps one store per shard). Whatever walks a stack walks ``wrapped``, never
``inner`` alone (a fan-out's ``inner`` is only its first branch, the store its forwarded
defaults would use):

- :func:`find_layer`: the one decorator of a class that every call of the stack passes
  through, or None; a layer that exists only below a fan-out is refused with
  :class:`LayerBelowFanOutError`, because no single one of them serves the whole stack;
- :func:`find_layers`: that layer on every branch (the outermost on each path);
- :func:`base_stores`: the stores at the bottom, each once (what a backup must cover).

Decorator authors import these from :mod:`loom_core.decorating`; this module's name is
private and may change.
"""

from __future__ import annotations

from typing import TypeVar

from loom_core.decisions import EventStoreDecorator
from loom_core.errors import InvalidOptionError
from loom_core.protocols import EventStore
from loom_core.storage import Storage

__all__ = ["LayerBelowFanOutError", "base_stores", "find_layer", "find_layers"]

_D = TypeVar("_D", bound=EventStoreDecorator)


class LayerBelowFanOutError(InvalidOptionError):
    """:func:`find_layer` found the layer only below a fan-out: each branch has its own
    (or some have none), so none of them serves the whole stack.

    ``fan_out`` is the decorator that fans out; ``found`` is the layer on each branch
    that has one, in branch order (what :func:`find_layers` returns).
    """

    def __init__(
        self,
        layer: type[EventStoreDecorator],
        fan_out: EventStoreDecorator,
        found: tuple[EventStoreDecorator, ...],
    ) -> None:
        self.layer = layer
        self.fan_out = fan_out
        self.found = found
        branches = len(fan_out.wrapped)
        super().__init__(
            f"{layer.__name__} is below {type(fan_out).__name__}, which fans out over "
            f"{branches} stores ({len(found)} of them have a {layer.__name__}): no single "
            f"{layer.__name__} serves this stack. Use find_layers() to act on every "
            f"branch's, or put {layer.__name__} above {type(fan_out).__name__}"
        )


def _top(target: Storage | EventStore) -> EventStore:
    return target.events if isinstance(target, Storage) else target


def find_layer(target: Storage | EventStore, layer: type[_D]) -> _D | None:
    """The outermost decorator of class ``layer`` in ``target``'s stack (a Storage or an
    event store): the one every call of the stack passes through. None if the stack has
    none at all.

    Raises :class:`LayerBelowFanOutError` when ``layer`` is found only below a fan-out
    (a decorator whose :attr:`~EventStoreDecorator.wrapped` names several stores): one
    branch's layer is not the stack's, and returning it would be a guess.
    """
    store = _top(target)
    while isinstance(store, EventStoreDecorator):
        if isinstance(store, layer):
            return store
        branches = store.wrapped
        if len(branches) != 1:
            found = find_layers(store, layer)
            if found:
                raise LayerBelowFanOutError(layer, store, found)
            return None
        store = branches[0]
    return None


def find_layers(target: Storage | EventStore, layer: type[_D]) -> tuple[_D, ...]:
    """Every decorator of class ``layer`` in ``target``'s stack that no other ``layer``
    wraps (the outermost on each path down every fan-out), in branch order, each once."""
    found: list[_D] = []
    seen: set[int] = set()

    def walk(store: EventStore) -> None:
        if id(store) in seen:
            return
        seen.add(id(store))
        if isinstance(store, layer):
            found.append(store)
        elif isinstance(store, EventStoreDecorator):
            for branch in store.wrapped:
                walk(branch)

    walk(_top(target))
    return tuple(found)


def base_stores(target: Storage | EventStore) -> tuple[EventStore, ...]:
    """The stores at the bottom of ``target``'s stack, below every decorator, in branch
    order, each once: one for a plain stack, one per shard under a fan-out."""
    found: list[EventStore] = []
    seen: set[int] = set()

    def walk(store: EventStore) -> None:
        if id(store) in seen:
            return
        seen.add(id(store))
        if isinstance(store, EventStoreDecorator):
            for branch in store.wrapped:
                walk(branch)
        else:
            found.append(store)

    walk(_top(target))
    return tuple(found)
