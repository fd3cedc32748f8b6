"""Fixtures for the loom-sqlite tests: a fresh database file per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Literal

import pytest
from sqlite_helpers import url_for

from loom_core import Storage, open_storage


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "loom.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    return url_for(db_path)


@pytest.fixture
async def storage(db_url: str) -> AsyncIterator[Storage]:
    async with open_storage(db_url) as opened:
        yield opened


@pytest.fixture
def loom_storage_factory(tmp_path: Path) -> Callable[[], Awaitable[Storage]]:
    """The conformance kit's hook: each call opens a fresh, empty SQLite file."""
    counter = iter(range(1_000_000))

    async def factory() -> Storage:
        return await open_storage(url_for(tmp_path / f"conformance-{next(counter)}.db"))

    return factory


@pytest.fixture
def loom_explorer_isolation() -> Literal["store", "execution"]:
    """The explorer's 2,047 schedules share one file, each on its own execution id: a new
    file per schedule would spend the run creating files and schemas."""
    return "execution"


_SKIPPED_CONFORMANCE: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # The kit skips a case whose optional method the store does not offer; this store
    # offers them all, so a skip here means a method silently went unchecked.
    if report.skipped and "test_sqlite_conformance.py" in report.nodeid:
        _SKIPPED_CONFORMANCE.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SKIPPED_CONFORMANCE:
        print(f"\nconformance cases skipped on SQLite (none may be): {_SKIPPED_CONFORMANCE}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
