"""The conformance kit's contract suites, run against PostgreSQL (fresh schema per store)."""

from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)

__all__ = ["TestEventStoreContract", "TestLeaseStoreContract", "TestTimerStoreContract"]
