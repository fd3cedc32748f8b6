"""The decorator machinery: params, factories, and capabilities that follow decisions."""

from collections.abc import Mapping
from typing import ClassVar

import pytest
from kit_decorators import FORWARDING, PICKY, PickyEventStore
from loom_conformance import memory_factory
from loom_conformance.decorating import (
    DecoratorCase,
    decided_capabilities,
    decisions_of,
    decorated_factory,
    decorator_params,
)

from loom_core import InvalidOptionError, Storage, Unsupported
from loom_core.decorating import DecoratorRegistry, EventStoreDecorator, InnerOpener, hookimpl
from loom_core.memory import MemoryEventStore
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, PluginHost

asyncio_test = pytest.mark.asyncio(loop_scope="function")

EVERY = frozenset(OPTIONAL_EVENT_STORE_METHODS)


def test_params_cover_every_registered_decorator_over_both_inner_stores() -> None:
    ids = [p.id for p in decorator_params(names=[FORWARDING, PICKY])]  # type: ignore[attr-defined]
    assert ids == [
        "kit-forwarding-over-full-memory",
        "kit-forwarding-over-bare-memory",
        "kit-picky-over-full-memory",
        "kit-picky-over-bare-memory",
    ]
    every = {p.values[0].decorator for p in decorator_params()}  # type: ignore[attr-defined]
    assert {FORWARDING, PICKY} <= every


def test_params_refuse_an_unknown_decorator_naming_the_installed_ones() -> None:
    with pytest.raises(InvalidOptionError, match="kit-forwarding"):
        decorator_params(names=["no-such-decorator"])


@asyncio_test
@pytest.mark.parametrize(
    ("decorator", "inner", "expected"),
    [
        (FORWARDING, "full", EVERY),
        (FORWARDING, "bare", frozenset()),
        (PICKY, "full", EVERY - {"delete_execution", "truncate_prefix_keeping"}),
        (PICKY, "bare", frozenset({"subscribe"})),
    ],
)
@asyncio_test
async def test_decorated_capabilities_follow_the_decisions_over_both_inners(
    decorator: str, inner: str, expected: frozenset[str]
) -> None:
    case = DecoratorCase(decorator, "full" if inner == "full" else "bare")
    storage = await case.factory()()
    try:
        assert storage.events.capabilities == expected
        assert isinstance(storage.events, EventStoreDecorator)
        assert decided_capabilities(storage.events) == expected
    finally:
        await storage.close()


@asyncio_test
async def test_conformance_options_reach_the_decorator() -> None:
    storage = await DecoratorCase(PICKY, "full").factory()()
    try:
        assert isinstance(storage.events, PickyEventStore)
        assert storage.events.poll_interval == 0.001
    finally:
        await storage.close()


@asyncio_test
async def test_refused_method_carries_the_decorators_reason() -> None:
    storage = await DecoratorCase(PICKY, "full").factory()()
    try:
        with pytest.raises(Unsupported, match="picky stores keep every log"):
            await storage.events.delete_execution("exec-1")
    finally:
        await storage.close()


@asyncio_test
async def test_forwarded_method_over_a_bare_inner_names_the_inner_store() -> None:
    storage = await DecoratorCase(FORWARDING, "bare").factory()()
    try:
        with pytest.raises(Unsupported, match="MemoryEventStore"):
            await storage.events.acquire_fence("exec-1")
    finally:
        await storage.close()


@asyncio_test
async def test_decorated_factory_wraps_any_base_factory() -> None:
    storage = await decorated_factory(PICKY, memory_factory(offer=("append_many",)))()
    try:
        assert storage.events.capabilities == {"append_many", "subscribe"}
    finally:
        await storage.close()


def test_an_undecorated_store_has_no_decisions() -> None:
    assert decisions_of(MemoryEventStore()) is None


class _ShardLike:
    """Opens one more inner store in conformance_options, as a sharding decorator would."""

    name = "kit-shard-like"
    opened: ClassVar[list[Storage]] = []

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        return storage

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        self.opened.append(await open_inner())
        return {}


class _ShardLikePlugin:
    @hookimpl
    def loom_register_decorators(self, registry: DecoratorRegistry) -> None:
        registry.add_decorator(_ShardLike())


@asyncio_test
async def test_stores_opened_for_conformance_options_close_with_the_decorated_one() -> None:
    host = PluginHost(entry_points=False)
    host.register(_ShardLikePlugin(), name="shard-like")
    _ShardLike.opened.clear()
    storage = await DecoratorCase("kit-shard-like", "full", host).factory()()
    assert len(_ShardLike.opened) == 1
    assert not _ShardLike.opened[0].closed
    await storage.close()
    assert _ShardLike.opened[0].closed
    assert storage.closed
