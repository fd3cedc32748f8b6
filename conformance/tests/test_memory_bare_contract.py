"""The kit over ``memory://`` offering no optional method: every refusal test runs, and
the runtime runs on its fallbacks (the tests that need an acquire are skipped, naming it)."""

import pytest
from loom_conformance import StorageFactory, memory_factory
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_conformance.suites.runtime import TestRuntimeContract

__all__ = [
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestRuntimeContract",
    "TestTimerStoreContract",
]


@pytest.fixture
def loom_storage_factory() -> StorageFactory:
    return memory_factory(offer=())
