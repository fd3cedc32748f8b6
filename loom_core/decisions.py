"""The base of every event-store decorator: each optional method is decided, explicitly.

A decorator wraps an inner :class:`~loom_core.spi.EventStore`. For **each** optional method
(:data:`~loom_core.spi.OPTIONAL_EVENT_STORE_METHODS`) it declares one decision in a
:class:`Decisions` mapping:

- :data:`FORWARD`: the inner store's method, offered exactly when the inner store offers it;
- ``Implement(method)``: the decorator's own ``method`` (defined in the class under the
  same name), offered while the inner store offers the method of that name (the common
  case: the decorator's code calls it); ``requires=(...)`` names other methods it needs
  instead, and ``requires=()`` offers it always (its code needs nothing optional below);
- ``Refuse(reason)``: absent from ``capabilities``; calling it raises ``Unsupported(reason)``.

::

    class Counting(EventStoreDecorator):
        async def append_many(self, requests):
            self.calls += 1
            return await self.inner.append_many(requests)

        decisions = Decisions(
            acquire_fence=FORWARD,
            acquire_fence_if=FORWARD,
            append_if_unchanged=FORWARD,
            append_many=Implement(append_many),
            delete_execution=Refuse("counting stores never delete"),
            copy_prefix=FORWARD,
            truncate_prefix_keeping=FORWARD,
            subscribe=FORWARD,
        )

The base checks the mapping when the subclass is *defined*: an undecided or unknown method,
an ``Implement`` without a method or naming a method the class does not define, or
decisions inherited silently from a parent all raise
:class:`~loom_core.errors.DecoratorDefinitionError` at import. Because :class:`Decisions` is
a total ``TypedDict``, mypy reports the same mistakes. Adding an optional method to the
kernel therefore breaks every decorator that has not decided it, on purpose.

The kernel's modules import the decorator base from here; decorator authors import it from
:mod:`loom_core.decorating`. This module's name is private and may change.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, TypedDict, TypeVar, final

from loom_core.errors import DecoratorDefinitionError, Unsupported
from loom_core.events import Event, NewEvent
from loom_core.protocols import (
    DEFAULT_LIST_LIMIT,
    OPTIONAL_EVENT_STORE_METHODS,
    EventStore,
    OptionalMethod,
)
from loom_core.refusal import RefusesUnoffered

__all__ = [
    "FORWARD",
    "Decision",
    "Decisions",
    "EventStoreDecorator",
    "Forward",
    "Implement",
    "Refuse",
]

_M = TypeVar("_M", bound=Callable[..., object], covariant=True)


@final
class Forward:
    """Decision: the inner store's method, offered exactly when the inner store offers it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FORWARD"


FORWARD: Final = Forward()


@final
@dataclass(frozen=True, slots=True)
class Implement(Generic[_M]):
    """Decision: the decorator's own method; offered while the inner offers ``requires``
    (by default, the method of the same name; ``()`` for always)."""

    method: _M
    requires: Iterable[OptionalMethod] | None = None

    def needs(self, method: str) -> frozenset[str]:
        """What the store below must offer for ``method``, decided this way, to be offered."""
        return frozenset({method}) if self.requires is None else frozenset(self.requires)


@final
@dataclass(frozen=True, slots=True)
class Refuse:
    """Decision: not offered, for ``reason`` (which ``Unsupported`` carries to the caller)."""

    reason: str


Decision = Forward | Implement[Callable[..., object]] | Refuse


class Decisions(TypedDict):
    """One decision per optional method; every key is required."""

    acquire_fence: Decision
    acquire_fence_if: Decision
    append_if_unchanged: Decision
    append_many: Decision
    delete_execution: Decision
    copy_prefix: Decision
    truncate_prefix_keeping: Decision
    subscribe: Decision


class EventStoreDecorator(RefusesUnoffered):
    """Wraps ``inner``; required methods forward unless overridden, optional ones follow
    the subclass's :class:`Decisions` (the refusing defaults inherited from
    :class:`~loom_core.spi.RefusesUnoffered` are replaced when the subclass is
    defined). Pass ``abstract=True`` in the class statement for an intermediate base that
    leaves the decisions to its subclasses."""

    decisions: ClassVar[Decisions]
    _offered_when: ClassVar[dict[OptionalMethod, frozenset[str] | None]] = {}

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner

    @property
    def wrapped(self) -> tuple[EventStore, ...]:
        """Every store this decorator calls, in order: ``(inner,)`` here. A fan-out (one
        decorator over several stores) overrides it to name each branch, so that
        :func:`find_layer`, :func:`find_layers`, :func:`base_stores` and anything else
        that walks a stack reach all of them."""
        return (self.inner,)

    def __init_subclass__(cls, *, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        _install_decisions(cls)

    @property
    def capabilities(self) -> frozenset[OptionalMethod]:
        """What the decisions offer over what *every* wrapped store offers (for a fan-out,
        a method one branch lacks is offered for no execution)."""
        inner = _offered_below(self)
        return frozenset(
            m for m, needs in self._offered_when.items() if needs is not None and needs <= inner
        )

    def _unsupported(self, method: str, reason: str) -> Unsupported:
        return Unsupported(method, type(self).__name__, reason)

    # -- required methods forward by default --------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        return await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        return await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )

    async def head(self, execution_id: str) -> int:
        return await self.inner.head(execution_id)

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        return await self.inner.list_executions(after=after, limit=limit)

    async def close(self) -> None:
        await self.inner.close()


def _install_decisions(cls: type[EventStoreDecorator]) -> None:
    name = cls.__qualname__
    if "decisions" not in cls.__dict__:
        raise DecoratorDefinitionError(
            f"{name} must declare its own `decisions` (one per optional method: "
            f"{', '.join(OPTIONAL_EVENT_STORE_METHODS)}); decisions are never inherited "
            "silently. Re-declare them, or pass abstract=True for an intermediate base."
        )
    decisions = cls.__dict__["decisions"]
    if not isinstance(decisions, dict):
        raise DecoratorDefinitionError(f"{name}.decisions must be a Decisions mapping")
    unknown = sorted(set(decisions) - set(OPTIONAL_EVENT_STORE_METHODS))
    if unknown:
        raise DecoratorDefinitionError(
            f"{name}.decisions names unknown method(s) {unknown}; the optional methods are "
            f"{list(OPTIONAL_EVENT_STORE_METHODS)}"
        )
    undecided = [m for m in OPTIONAL_EVENT_STORE_METHODS if m not in decisions]
    if undecided:
        raise DecoratorDefinitionError(
            f"{name} does not decide {undecided}: declare FORWARD, Implement(method) or "
            "Refuse(reason) for each"
        )
    offered_when: dict[OptionalMethod, frozenset[str] | None] = {}
    for method in OPTIONAL_EVENT_STORE_METHODS:
        decision = decisions[method]
        own = cls.__dict__.get(method)
        if isinstance(decision, Forward):
            if own is not None:
                raise DecoratorDefinitionError(
                    f"{name} decides {method} as FORWARD but defines {method}(); "
                    "use Implement(...) for the decorator's own code"
                )
            setattr(cls, method, _forwarder(method))
            offered_when[method] = frozenset({method})
        elif isinstance(decision, Refuse):
            if not isinstance(decision.reason, str) or not decision.reason.strip():
                raise DecoratorDefinitionError(f"{name}: Refuse for {method} needs a reason")
            if own is not None:
                raise DecoratorDefinitionError(
                    f"{name} refuses {method} but defines {method}(); remove one of the two"
                )
            setattr(cls, method, _refuser(method, decision.reason))
            offered_when[method] = None
        elif isinstance(decision, Implement):
            implemented = decision.method
            if own is None or not callable(implemented) or own is not implemented:
                raise DecoratorDefinitionError(
                    f"{name} decides {method} as Implement but Implement must name the "
                    f"class's own {method}() method (got {implemented!r})"
                )
            requires = decision.needs(method)
            bad = sorted(requires - set(OPTIONAL_EVENT_STORE_METHODS))
            if bad or isinstance(decision.requires, str):
                raise DecoratorDefinitionError(
                    f"{name}: Implement({method}).requires must list optional methods, got "
                    f"{decision.requires!r}"
                )
            if requires:
                setattr(cls, method, _guarded(method, implemented, requires))
            offered_when[method] = requires
        else:
            raise DecoratorDefinitionError(
                f"{name}.decisions[{method!r}] is {decision!r}; expected FORWARD, "
                "Implement(method) or Refuse(reason)"
            )
    cls._offered_when = offered_when


def _forwarder(method: str) -> Callable[..., object]:
    if method == "subscribe":

        def subscribe(
            self: EventStoreDecorator, execution_id: str, *, from_sequence: int = 0
        ) -> AsyncIterator[Event]:
            _require(self, method, frozenset({method}))
            return self.inner.subscribe(execution_id, from_sequence=from_sequence)

        return subscribe

    async def forward(self: EventStoreDecorator, *args: Any, **kwargs: Any) -> object:
        _require(self, method, frozenset({method}))
        return await getattr(self.inner, method)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = method
    return forward


def _refuser(method: str, reason: str) -> Callable[..., object]:
    if method == "subscribe":

        def refuse_subscribe(self: EventStoreDecorator, *args: Any, **kwargs: Any) -> object:
            raise self._unsupported(method, reason)

        return refuse_subscribe

    async def refuse(self: EventStoreDecorator, *args: Any, **kwargs: Any) -> object:
        raise self._unsupported(method, reason)

    refuse.__name__ = refuse.__qualname__ = method
    return refuse


def _guarded(
    method: str, implemented: Callable[..., Any], requires: frozenset[str]
) -> Callable[..., object]:
    if method == "subscribe":

        @functools.wraps(implemented)
        def guarded_subscribe(self: EventStoreDecorator, *args: Any, **kwargs: Any) -> object:
            _require(self, method, requires)
            return implemented(self, *args, **kwargs)

        return guarded_subscribe

    @functools.wraps(implemented)
    async def guarded(self: EventStoreDecorator, *args: Any, **kwargs: Any) -> object:
        _require(self, method, requires)
        return await implemented(self, *args, **kwargs)

    return guarded


def _offered_below(store: EventStoreDecorator) -> frozenset[OptionalMethod]:
    branches = store.wrapped
    offered = branches[0].capabilities
    for branch in branches[1:]:
        offered &= branch.capabilities
    return offered


def _require(store: EventStoreDecorator, method: str, requires: frozenset[str]) -> None:
    missing = sorted(requires - _offered_below(store))
    if missing:
        branches = store.wrapped
        below = (
            f"the inner store {type(branches[0]).__name__} does not"
            if len(branches) == 1
            else f"not every one of the {len(branches)} stores it wraps does"
        )
        raise store._unsupported(method, f"{below} offer {', '.join(missing)}")
