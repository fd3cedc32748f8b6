"""The kit over the reference stores: ``memory://`` offering every optional method."""

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
