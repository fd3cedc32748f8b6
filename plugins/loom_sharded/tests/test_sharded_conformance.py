"""The conformance kit through ``sharded``, as the kit builds it.

Over an inner ``memory://`` store offering every optional method and over one offering
none, with three shards (the store under test and two more from ``open_inner``) and the
decorator's ``conformance_options`` (``colocate="-"``, so the kit's multi-execution cases
keep their ids on one shard; see ``loom_sharded.plugin.CONFORMANCE_COLOCATE``).
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

__all__ = [
    "TestDecoratorContract",
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestTimerStoreContract",
]


@pytest.fixture(params=decorator_params(names=["sharded"]))
def loom_storage_factory(request: pytest.FixtureRequest) -> StorageFactory:
    case: DecoratorCase = request.param
    return case.factory()
