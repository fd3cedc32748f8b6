"""The whole contract, the runtime's included, through every registered decorator, over
an inner store offering every optional method and over one offering none."""

import pytest
from loom_conformance import StorageFactory
from loom_conformance.decorating import DecoratorCase, decorator_params
from loom_conformance.suites import (
    TestDecoratorContract,
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_conformance.suites.runtime import TestRuntimeContract

__all__ = [
    "TestDecoratorContract",
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestRuntimeContract",
    "TestTimerStoreContract",
]


@pytest.fixture(params=decorator_params())
def loom_storage_factory(request: pytest.FixtureRequest) -> StorageFactory:
    case: DecoratorCase = request.param
    return case.factory()
