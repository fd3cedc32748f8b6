"""The conformance kit through the audit decorator, over an inner memory store offering
every optional method and over one offering none."""

from __future__ import annotations

import pytest
from loom_conformance import StorageFactory
from loom_conformance.decorating import DecoratorCase, decorator_params
from loom_conformance.suites import (
    TestDecoratorContract,
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)

__all__ = [
    "TestDecoratorContract",
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestTimerStoreContract",
]


@pytest.fixture(params=decorator_params(names=["audit"]))
def loom_storage_factory(request: pytest.FixtureRequest) -> StorageFactory:
    case: DecoratorCase = request.param
    return case.factory()
