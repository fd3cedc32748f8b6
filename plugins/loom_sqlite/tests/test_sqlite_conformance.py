"""The conformance kit, unchanged, over ``sqlite:///``: the event, timer and lease
contracts, with every optional method offered and so run (none skipped), the schedule
explorer, and the runtime's workflows on the store. ``loom_storage_factory``
(conftest.py) opens a fresh file per call."""

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
