"""``TestDecoratorContract``: every registered decorator decides every optional method,
and a decorated store's ``capabilities`` follow those decisions over both inner stores."""

from __future__ import annotations

import pytest

from loom_conformance.decorating import DecoratorCase, decided_capabilities, decisions_of
from loom_conformance.suites._support import snapshot
from loom_conformance.suites.events_required import _call_optional
from loom_core import (
    OPTIONAL_EVENT_STORE_METHODS,
    EventStoreDecorator,
    Forward,
    Implement,
    Refuse,
    Unsupported,
)

__all__ = ["TestDecoratorContract"]


class TestDecoratorContract:
    """Parametrized by the kit over every registered decorator times {an inner store
    offering every optional method, one offering none} (the ``loom_decorator_case``
    fixture, filled from :func:`loom_conformance.decorating.decorator_params`)."""

    pytestmark = pytest.mark.asyncio(loop_scope="function")

    async def test_decorator_decides_every_optional_method(
        self, loom_decorator_case: DecoratorCase
    ) -> None:
        storage = await loom_decorator_case.factory()()
        try:
            events = storage.events
            decisions = decisions_of(events)
            assert decisions is not None, (
                f"decorator {loom_decorator_case.decorator!r} returned an event store of "
                f"type {type(events).__name__}, which is not an EventStoreDecorator: wrap the "
                "inner event store in a subclass that declares Decisions for every optional "
                "method"
            )
            assert "decisions" in type(events).__dict__, "decisions are declared, not inherited"
            assert set(decisions) == set(OPTIONAL_EVENT_STORE_METHODS)
            for method, decision in decisions.items():
                assert isinstance(decision, Forward | Implement | Refuse), (method, decision)
        finally:
            await storage.close()

    async def test_decorated_capabilities_follow_the_decisions(
        self, loom_decorator_case: DecoratorCase
    ) -> None:
        storage = await loom_decorator_case.factory()()
        try:
            events = storage.events
            assert isinstance(events, EventStoreDecorator)
            assert events.capabilities == decided_capabilities(events)
        finally:
            await storage.close()

    async def test_refused_and_unavailable_methods_raise_unsupported(
        self, loom_decorator_case: DecoratorCase
    ) -> None:
        storage = await loom_decorator_case.factory()()
        try:
            events = storage.events
            decisions = decisions_of(events) or {}
            before = await snapshot(events, "exec-new")
            for method in OPTIONAL_EVENT_STORE_METHODS:
                if method in events.capabilities:
                    continue
                with pytest.raises(Unsupported) as caught:
                    await _call_optional(events, method, "exec-new")
                assert caught.value.method == method
                decision = decisions.get(method)
                if isinstance(decision, Refuse):
                    assert decision.reason in str(caught.value)
            assert await snapshot(events, "exec-new") == before
        finally:
            await storage.close()
