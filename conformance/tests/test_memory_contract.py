"""The kit over the reference stores: ``memory://`` offering every optional method."""

from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)

__all__ = ["TestEventStoreContract", "TestLeaseStoreContract", "TestTimerStoreContract"]
