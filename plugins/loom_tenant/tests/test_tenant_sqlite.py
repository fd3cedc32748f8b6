"""The conformance kit through ``tenant`` over a real SQLite file.

Built by the kit's own :func:`~loom_conformance.decorating.decorated_factory` (the
decorator's ``conformance_options``: the tenant ``kit/0:tenant:é``).
"""

import itertools
from pathlib import Path
from typing import Literal

import pytest
from loom_conformance import StorageFactory
from loom_conformance.decorating import decorated_factory
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_conformance.suites.runtime import TestRuntimeContract

from loom_core import Storage, open_storage

__all__ = [
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestRuntimeContract",
    "TestTimerStoreContract",
]


@pytest.fixture
def loom_storage_factory(tmp_path: Path) -> StorageFactory:
    counter = itertools.count()

    async def open_sqlite() -> Storage:
        return await open_storage(f"sqlite:///{tmp_path / f'kit-{next(counter)}.db'}")

    return decorated_factory("tenant", open_sqlite)


@pytest.fixture
def loom_explorer_isolation() -> Literal["store", "execution"]:
    """The explorer's 2,047 schedules on their own ids in one file, not one file each."""
    return "execution"
