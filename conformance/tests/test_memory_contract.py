"""The kit over the reference stores: ``memory://`` offering every optional method."""

from loom_conformance.suites import TestEventStoreContract

__all__ = ["TestEventStoreContract"]
