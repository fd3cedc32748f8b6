"""Running the whole contract through a decorator.

A decorator plugin proves itself by running the same suites as a store, over a store
that offers every optional method and over one that offers none, so each of its
decisions (forward, implement, refuse) is exercised on both sides::

    # conftest.py of a decorator plugin
    import pytest
    from loom_conformance.decorating import decorator_params

    @pytest.fixture(params=decorator_params(names=["tenant"]))
    def loom_storage_factory(request):
        return request.param.factory()

    # test_conformance.py
    from loom_conformance.suites import (
        TestDecoratorContract, TestEventStoreContract, TestLeaseStoreContract,
        TestTimerStoreContract,
    )

``decorator_params()`` with no names runs every decorator registered with the plugin host
(the ``loom`` entry points, plus any registered in-process before collection). The
decorator is applied by name through :func:`loom_core.open_storage` (``decorators=``) with
the options its ``conformance_options(open_inner)`` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

import pytest

from loom_conformance.factory import StorageFactory
from loom_core import Storage, open_storage
from loom_core.decorating import Decision, EventStoreDecorator, Forward, Implement
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, OptionalMethod, PluginHost, default_plugins

__all__ = [
    "INNER_KINDS",
    "DecoratorCase",
    "InnerKind",
    "decided_capabilities",
    "decisions_of",
    "decorated_factory",
    "decorated_url_factory",
    "decorator_params",
]

InnerKind: TypeAlias = Literal["full", "bare"]
"""``full``: an inner ``memory://`` store offering every optional method; ``bare``: one
offering none (each raises ``Unsupported``)."""

INNER_KINDS: Final[tuple[InnerKind, ...]] = ("full", "bare")
_OFFER: Final[Mapping[InnerKind, Mapping[str, object]]] = {"full": {}, "bare": {"offer": ()}}


def _host(plugins: PluginHost | None) -> PluginHost:
    return plugins if plugins is not None else default_plugins()


def decorated_url_factory(
    decorator: str,
    url: str,
    *,
    backend_options: Mapping[str, object] | None = None,
    plugins: PluginHost | None = None,
) -> StorageFactory:
    """A factory opening ``url`` wrapped by the registered ``decorator``, through
    ``open_storage(url, decorators=[(decorator, options)])``, with the options the
    decorator's ``conformance_options`` returns (its ``open_inner`` opens ``url`` again;
    the stores it opens are closed with the decorated storage)."""

    async def open_decorated() -> Storage:
        host = _host(plugins)
        extra: list[Storage] = []

        async def open_inner() -> Storage:
            storage = await open_storage(url, options=backend_options, plugins=host)
            extra.append(storage)
            return storage

        try:
            options = await host.decorator(decorator).conformance_options(open_inner)
            storage = await open_storage(
                url, decorators=[(decorator, options)], options=backend_options, plugins=host
            )
        except BaseException:
            await _close_all(extra)
            raise
        return _owning(storage, extra)

    return open_decorated


def decorated_factory(
    decorator: str, base: StorageFactory, *, plugins: PluginHost | None = None
) -> StorageFactory:
    """A factory wrapping each storage ``base`` opens with the registered ``decorator``
    (``decorate(storage, options)`` with its ``conformance_options(base)``); for a base
    that is not a URL, e.g. a store author's own factory."""

    async def open_decorated() -> Storage:
        decorator_ = _host(plugins).decorator(decorator)
        extra: list[Storage] = []

        async def open_inner() -> Storage:
            storage = await base()
            extra.append(storage)
            return storage

        inner: Storage | None = None
        try:
            options = await decorator_.conformance_options(open_inner)
            inner = await base()
            storage = await decorator_.decorate(inner, options)
        except BaseException:
            if inner is not None:
                await inner.close()
            await _close_all(extra)
            raise
        return _owning(storage, extra)

    return open_decorated


async def _close_all(storages: list[Storage]) -> None:
    for storage in storages:
        await storage.close()


def _owning(storage: Storage, extra: list[Storage]) -> Storage:
    """``storage``, closing ``extra`` with it (Storage.close is idempotent, so a decorator
    that already closes them is fine)."""
    if not extra:
        return storage

    async def close_all() -> None:
        await storage.close()
        await _close_all(extra)

    return Storage(storage.events, storage.timers, storage.leases, url=storage.url,
                   on_close=close_all)


@dataclass(frozen=True, slots=True)
class DecoratorCase:
    """One registered decorator over one kind of inner ``memory://`` store."""

    decorator: str
    inner: InnerKind
    plugins: PluginHost | None = field(default=None, compare=False, repr=False)

    @property
    def id(self) -> str:
        return f"{self.decorator}-over-{self.inner}-memory"

    @property
    def backend_options(self) -> Mapping[str, object]:
        """The ``memory://`` options that open this case's inner store."""
        return _OFFER[self.inner]

    def factory(self) -> StorageFactory:
        """The :data:`StorageFactory` to return from ``loom_storage_factory``."""
        return decorated_url_factory(
            self.decorator, "memory://", backend_options=self.backend_options,
            plugins=self.plugins,
        )


def decorator_params(
    names: list[str] | None = None, *, plugins: PluginHost | None = None
) -> list[object]:
    """``pytest.param`` values: every registered decorator (or ``names``) times every inner
    kind (:data:`INNER_KINDS`), each a :class:`DecoratorCase` with a readable id.

    A name that is not registered raises, naming the installed decorators, at collection.
    """
    host = _host(plugins)
    chosen = sorted(host.decorators.decorators) if names is None else list(names)
    params: list[object] = []
    for name in chosen:
        host.decorator(name)  # refuses an unknown name, listing the installed ones
        for inner in INNER_KINDS:
            case = DecoratorCase(name, inner, plugins)
            params.append(pytest.param(case, id=case.id))
    return params


def decisions_of(store: object) -> Mapping[OptionalMethod, Decision] | None:
    """The decisions of a decorated event store's class, or None if ``store`` is not an
    :class:`~loom_core.decorating.EventStoreDecorator`."""
    if not isinstance(store, EventStoreDecorator):
        return None
    decisions: Mapping[OptionalMethod, Decision] = type(store).decisions  # type: ignore[assignment]
    return decisions


def _offered(method: OptionalMethod, decision: Decision | None, inner: frozenset[str]) -> bool:
    if isinstance(decision, Forward):
        return method in inner
    if isinstance(decision, Implement):
        return decision.needs(method) <= inner
    return False  # Refuse, or no decision at all


def decided_capabilities(store: EventStoreDecorator) -> frozenset[OptionalMethod]:
    """What ``capabilities`` must be, by the class's decisions and the inner store's
    capabilities: FORWARD where the inner offers it, Implement where the inner offers
    everything it ``requires``, Refuse never."""
    inner: frozenset[str] = frozenset(store.inner.capabilities)
    decisions = decisions_of(store) or {}
    return frozenset(
        m for m in OPTIONAL_EVENT_STORE_METHODS if _offered(m, decisions.get(m), inner)
    )
