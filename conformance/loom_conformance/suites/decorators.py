"""``TestDecoratorContract``: every registered decorator wraps the event store in an
:class:`~loom_core.decorating.EventStoreDecorator` (whose class decided every optional
method when it was defined), serves every method its ``capabilities`` offers, and refuses
the rest with ``Unsupported``, over both inner stores."""

from __future__ import annotations

import pytest

from loom_conformance.decorating import DecoratorCase, decisions_of, decorated_factory
from loom_conformance.suites._support import app, snapshot
from loom_conformance.suites.events_required import _call_optional
from loom_core import InvalidOptionError, LoomError, Storage, Unsupported, open_storage
from loom_core.decorating import Refuse
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, default_plugins

__all__ = ["TestDecoratorContract"]


class TestDecoratorContract:
    """Parametrized by the kit over every registered decorator times {an inner store
    offering every optional method, one offering none} (the ``loom_decorator_case``
    fixture, filled from :func:`loom_conformance.decorating.decorator_params`)."""

    pytestmark = pytest.mark.asyncio(loop_scope="function")

    async def test_decorator_returns_an_event_store_decorator(
        self, loom_decorator_case: DecoratorCase
    ) -> None:
        """The decisions are checked when the class is defined (and by mypy); what only a
        running decorator can show is whether it really wraps the inner store in one."""
        storage = await loom_decorator_case.factory()()
        try:
            events = storage.events
            assert decisions_of(events) is not None, (
                f"decorator {loom_decorator_case.decorator!r} returned an event store of "
                f"type {type(events).__name__}, which is not an EventStoreDecorator: wrap the "
                "inner event store in a subclass that declares Decisions for every optional "
                "method"
            )
        finally:
            await storage.close()

    async def test_every_offered_method_is_served_not_refused(
        self, loom_decorator_case: DecoratorCase
    ) -> None:
        """``capabilities`` is a promise: each method it names answers (with a result or a
        contract error for these arguments), never with Unsupported."""
        storage = await loom_decorator_case.factory()()
        try:
            events = storage.events
            await events.append("exec-src", [app(), app()], expected_sequence=0)
            broken: list[str] = []
            for method in OPTIONAL_EVENT_STORE_METHODS:
                if method not in events.capabilities:
                    continue
                try:
                    await _call_optional(events, method, "exec-src")
                except Unsupported as exc:
                    broken.append(f"{method}: {exc}")
                except LoomError:
                    pass  # a contract refusal of these arguments: the method is served
            assert not broken, f"offered in capabilities but refused when called: {broken}"
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

    async def test_closing_the_decorated_storage_closes_the_storage_it_was_given(
        self, loom_decorator_case: DecoratorCase
    ) -> None:
        """What ``decorate`` is given may own more than its three stores (a pool, a file,
        the shards), which only its own ``close`` releases."""
        closed: list[str] = []

        async def open_watched() -> Storage:
            storage = await open_storage(
                "memory://", options=loom_decorator_case.backend_options,
                plugins=loom_decorator_case.plugins,
            )
            name = f"storage {len(opened) + 1}"
            opened.append(name)

            async def close() -> None:
                closed.append(name)
                await storage.close()

            return Storage(storage.events, storage.timers, storage.leases, url=storage.url,
                           on_close=close)

        opened: list[str] = []
        decorated = await decorated_factory(
            loom_decorator_case.decorator, open_watched, plugins=loom_decorator_case.plugins
        )()
        await decorated.close()
        # The last one opened is the storage decorate() was given (the others are what
        # conformance_options opened, which the kit closes itself).
        assert opened[-1] in closed, (
            f"closing the storage that decorator {loom_decorator_case.decorator!r} returned "
            "did not close the storage its decorate() was given: pass "
            "on_close=storage.close (or close it in your own on_close)"
        )

    async def test_an_unknown_option_is_refused_with_invalid_option_error(
        self, loom_decorator_case: DecoratorCase
    ) -> None:
        """A misspelt option must not be ignored (a tenant's name, a key store), nor fail
        as a bare KeyError or TypeError from deep inside ``decorate``."""
        host = loom_decorator_case.plugins or default_plugins()
        decorator = host.decorator(loom_decorator_case.decorator)
        extra: list[Storage] = []

        async def open_inner() -> Storage:
            storage = await open_storage(
                "memory://", options=loom_decorator_case.backend_options, plugins=host
            )
            extra.append(storage)
            return storage

        try:
            options = {**await decorator.conformance_options(open_inner),
                       "loom-kit-no-such-option": True}
            try:
                storage = await open_storage(
                    "memory://", decorators=[(loom_decorator_case.decorator, options)],
                    options=loom_decorator_case.backend_options, plugins=host,
                )
            except InvalidOptionError:
                return
            except Exception as exc:
                raise AssertionError(
                    f"decorator {loom_decorator_case.decorator!r} refused an unknown option "
                    f"with {type(exc).__name__}: {exc}; refuse options you do not know with "
                    "loom_core.InvalidOptionError"
                ) from exc
            await storage.close()
            raise AssertionError(
                f"decorator {loom_decorator_case.decorator!r} accepted the unknown option "
                "'loom-kit-no-such-option'; refuse options you do not know with "
                "loom_core.InvalidOptionError, so a misspelt one is not silently ignored"
            )
        finally:
            for storage in extra:
                await storage.close()
