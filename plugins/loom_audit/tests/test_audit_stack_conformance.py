"""The conformance kit through the documented stack, crypto above the audit chain
(``decorators=["audit", ("crypto", ...)]``): over an inner memory store offering every
optional method, over one offering none, and over SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from loom_conformance import StorageFactory
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_conformance.suites.runtime import TestRuntimeContract
from loom_crypto import MemoryKeyStore

from loom_core import NewEvent, Storage, open_storage

__all__ = [
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestRuntimeContract",
    "TestTimerStoreContract",
]

BASES = ["full-memory", "bare-memory", "sqlite"]


def _subject(execution_id: str, event: NewEvent) -> str:
    return execution_id


@pytest.fixture(params=BASES, ids=lambda base: f"audit-then-crypto-over-{base}")
def stack_base(request: pytest.FixtureRequest) -> str:
    base: str = request.param
    return base


@pytest.fixture
def loom_storage_factory(stack_base: str, tmp_path: Path) -> StorageFactory:
    files = iter(range(1_000_000))

    async def open_stack() -> Storage:
        crypto = ("crypto", {"key_store": MemoryKeyStore(), "subject_of": _subject})
        if stack_base == "sqlite":
            url, options = f"sqlite:///{tmp_path / f'stack-{next(files)}.db'}", {}
        else:
            url, options = "memory://", {"offer": ()} if stack_base == "bare-memory" else {}
        return await open_storage(url, decorators=["audit", crypto], options=options)

    return open_stack


@pytest.fixture
def loom_explorer_isolation(stack_base: str) -> Literal["store", "execution"]:
    # One SQLite file for the explorer's 2,047 schedules, each on its own execution id.
    return "execution" if stack_base == "sqlite" else "store"
