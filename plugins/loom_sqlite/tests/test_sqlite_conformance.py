"""The conformance kit, unchanged, over ``sqlite:///``: the event, timer and lease
contracts, with every optional method offered and so run (none skipped), and the schedule
explorer. ``loom_storage_factory`` (conftest.py) opens a fresh file per call."""

from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)

__all__ = ["TestEventStoreContract", "TestLeaseStoreContract", "TestTimerStoreContract"]
