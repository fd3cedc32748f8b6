"""The types a type checker gives code that opens storage or registers a store, pinned.

The lint env runs ``mypy --strict`` over this file: each ``assert_type`` fails the check
when an annotation loosens, and each call marked ``# type: ignore[code]`` must stay an
error, as strict mode reports an ignore that is no longer needed. The tests run the same
code, so what is asserted of a call's type is also what the call returns.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import assert_type

import pytest

from loom_core import (
    Event,
    EventStore,
    Lease,
    LeaseStore,
    NewEvent,
    SequenceConflictError,
    Storage,
    TimerRecord,
    TimerStore,
    open_storage,
)
from loom_core.spi import BackendFactory, BackendRegistry, PluginHost, hookimpl


async def test_storage_and_its_stores_give_typed_values() -> None:
    host = PluginHost(entry_points=False)
    async with open_storage("memory://", plugins=host) as storage:
        assert_type(storage, Storage)
        assert_type(storage.events, EventStore)
        assert_type(storage.timers, TimerStore)
        assert_type(storage.leases, LeaseStore)
        written = await storage.events.append("e", [NewEvent("k", {"n": 1})], expected_sequence=0)
        assert_type(written, tuple[Event, ...])
        assert_type(await storage.events.read("e"), tuple[Event, ...])
        assert_type(await storage.events.head("e"), int)
        assert_type(await storage.events.list_executions(), tuple[str, ...])
        now = datetime.now(UTC)
        await storage.timers.schedule(TimerRecord("e", now))
        assert_type(await storage.timers.due(now), tuple[TimerRecord, ...])
        lease = await storage.leases.acquire("k", "me", ttl_seconds=30)
        assert_type(lease, Lease)
        with pytest.raises(SequenceConflictError) as conflict:
            await storage.events.append("e", [NewEvent("k")], expected_sequence=5)
        assert_type(conflict.value.actual_head, int)
        assert conflict.value.actual_head == 1
    opened = await open_storage("memory://", plugins=host)
    assert_type(opened, Storage)
    await opened.close()


async def open_typed(url: str, options: Mapping[str, object]) -> Storage:
    return await open_storage("memory://", plugins=PluginHost(entry_points=False))


@hookimpl
def loom_register_backends(registry: BackendRegistry) -> None:
    registry.add_backend("typed", open_typed)


async def test_a_store_plugins_hook_and_factory_keep_their_types() -> None:
    assert_type(loom_register_backends(BackendRegistry()), None)
    plugin = types.SimpleNamespace(loom_register_backends=loom_register_backends)
    host = PluginHost(entry_points=False)
    host.register(plugin, name="typed")
    factory = host.backend_for("typed")
    assert_type(factory, BackendFactory)
    assert factory is open_typed
    async with open_storage("typed://", plugins=host) as storage:
        assert_type(storage, Storage)


def _calls_the_type_checker_refuses(registry: BackendRegistry) -> None:
    """Never run: each call is wrong in a way the checker sees before a store is opened."""

    def not_a_factory(url: str) -> None:
        return None

    registry.add_backend("bad", not_a_factory)  # type: ignore[arg-type]
    loom_register_backends("not a registry")  # type: ignore[arg-type]
