"""The conformance kit, unchanged, over ``example://``. Offered optional methods run their
contract tests; the others are checked to raise ``Unsupported``."""

from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)

__all__ = ["TestEventStoreContract", "TestLeaseStoreContract", "TestTimerStoreContract"]
