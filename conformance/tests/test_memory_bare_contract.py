"""The kit over ``memory://`` offering no optional method: every refusal test runs."""

import pytest
from loom_conformance import StorageFactory, memory_factory
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)

__all__ = ["TestEventStoreContract", "TestLeaseStoreContract", "TestTimerStoreContract"]


@pytest.fixture
def loom_storage_factory() -> StorageFactory:
    return memory_factory(offer=())
