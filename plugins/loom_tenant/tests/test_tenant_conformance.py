"""The conformance kit through ``tenant``, as the kit builds it.

Over an inner ``memory://`` store offering every optional method and over one offering
none, under the decorator's ``conformance_options`` (the tenant ``kit/0:tenant:é``, a
name full of separators, so the kit also exercises the encoding).
"""

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


@pytest.fixture(params=decorator_params(names=["tenant"]))
def loom_storage_factory(request: pytest.FixtureRequest) -> StorageFactory:
    case: DecoratorCase = request.param
    return case.factory()
