"""The pytest plugin (entry point ``pytest11: loom_conformance``), loaded by pytest whenever
``loom-conformance`` is installed.

It provides the fixtures the suites use. A store author overrides exactly one of them,
``loom_storage_factory``, in a ``conftest.py``::

    import pytest
    from loom_core import open_storage

    @pytest.fixture
    def loom_storage_factory():
        async def open_fresh():
            return await open_storage("mystore://…")  # a fresh, empty store each call
        return open_fresh

Every fixture and every suite test names its event loop explicitly, so the suites run
the same whatever ``asyncio_mode`` the project using them has chosen (``strict`` or
``auto``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final, Literal

import pytest
import pytest_asyncio

from loom_conformance.factory import StorageFactory, memory_factory
from loom_conformance.requirements import (
    COVERAGE_PROPERTY,
    REQUIRES_ANY_MARK,
    REQUIRES_MARK,
    missing,
)
from loom_core import EventStore, LeaseStore, Storage, TimerStore
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS

__all__ = [
    "loom_events",
    "loom_explorer_isolation",
    "loom_leases",
    "loom_storage",
    "loom_storage_factory",
    "loom_timers",
]

DECORATOR_CASE_FIXTURE: Final = "loom_decorator_case"
DECORATORS_INI: Final = "loom_decorators"


class _OptionalMethodTally:
    """Counts, per optional method, the passing refusal-or-offered checks by branch, and
    prints them at the end of the run so a store author sees that none went untested."""

    def __init__(self) -> None:
        self.offered: dict[str, int] = {}
        self.refused: dict[str, int] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" or not report.passed:
            return
        for name, value in report.user_properties:
            if name == COVERAGE_PROPERTY and isinstance(value, tuple):
                method, offered = value
                tally = self.offered if offered else self.refused
                tally[method] = tally.get(method, 0) + 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not (self.offered or self.refused):
            return
        terminalreporter.section("loom-conformance: optional event-store methods")
        for method in OPTIONAL_EVENT_STORE_METHODS:
            offered, refused = self.offered.get(method, 0), self.refused.get(method, 0)
            if not offered and not refused:
                verdict = "NOT CHECKED"
            else:
                parts = []
                if offered:
                    parts.append(f"offered, contract run ({offered} store(s))")
                if refused:
                    parts.append(f"not offered, Unsupported checked ({refused} store(s))")
                verdict = "; ".join(parts)
            terminalreporter.write_line(f"  {method:<24} {verdict}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_OptionalMethodTally(), "loom-conformance-tally")
    config.addinivalue_line(
        "markers",
        f"{REQUIRES_MARK}(*methods): run only where the store offers every named optional "
        "method (see loom_conformance.requirements)",
    )
    config.addinivalue_line(
        "markers",
        f"{REQUIRES_ANY_MARK}(*methods): run only where the store offers at least one of "
        "the named optional methods",
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        DECORATORS_INI,
        "decorator names TestDecoratorContract checks (default: every registered one)",
        type="linelist",
        default=[],
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The decorator checks run once per registered decorator and inner store, found when
    # the tests are collected (entry points, or plugins a conftest registered in-process).
    if DECORATOR_CASE_FIXTURE in metafunc.fixturenames:
        from loom_conformance.decorating import decorator_params

        names = metafunc.config.getini(DECORATORS_INI)
        metafunc.parametrize(DECORATOR_CASE_FIXTURE, decorator_params(names or None))


@pytest.fixture
def loom_storage_factory() -> StorageFactory:
    """THE fixture a store author overrides: a factory opening a fresh, empty storage.

    Default: ``memory://`` with every optional method (the reference implementation).
    """
    return memory_factory()


@pytest.fixture
def loom_explorer_isolation() -> Literal["store", "execution"]:
    """How the schedule explorer isolates its 2,047 schedules: ``"store"`` (default) opens
    a fresh storage per schedule from ``loom_storage_factory``; a backend whose open is
    expensive (a connection pool, a migration) may override this with ``"execution"``, which
    runs every schedule on its own execution id in one storage."""
    return "store"


@pytest_asyncio.fixture(loop_scope="function")
async def loom_storage(
    loom_storage_factory: StorageFactory, request: pytest.FixtureRequest
) -> AsyncIterator[Storage]:
    """A fresh storage from ``loom_storage_factory``, closed after the test.

    A test marked with a requirement (``loom_conformance.requirements``) the event store
    does not offer is skipped here, with a reason naming the method and the refusal test
    that checked ``Unsupported`` instead.
    """
    storage = await loom_storage_factory()
    try:
        await _refuse_a_shared_storage(storage)
        all_of = tuple(
            m for mark in request.node.iter_markers(REQUIRES_MARK) for m in mark.args
        )
        any_of = tuple(tuple(mark.args) for mark in request.node.iter_markers(REQUIRES_ANY_MARK))
        reason = missing(storage.events.capabilities, all_of, any_of)
        if reason is not None:
            pytest.skip(reason)
        yield storage
    finally:
        await storage.close()


async def _refuse_a_shared_storage(storage: Storage) -> None:
    """Fail with one clear message when the factory hands out a storage that already holds
    logs: every suite test assumes a fresh store, and a shared one fails them all for
    reasons that have nothing to do with the test's name."""
    held = await storage.events.list_executions(limit=3)
    if held:
        pytest.fail(
            f"loom_storage_factory returned a storage that already holds executions "
            f"({', '.join(map(repr, held))}, ...): it must open a fresh, empty storage on "
            "every call (a new database, schema or file, or memory://), or every test sees "
            "the others' logs",
            pytrace=False,
        )


@pytest.fixture
def loom_events(loom_storage: Storage) -> EventStore:
    """The event store of ``loom_storage``."""
    return loom_storage.events


@pytest.fixture
def loom_timers(loom_storage: Storage) -> TimerStore:
    """The timer store of ``loom_storage``."""
    return loom_storage.timers


@pytest.fixture
def loom_leases(loom_storage: Storage) -> LeaseStore:
    """The lease store of ``loom_storage``."""
    return loom_storage.leases
