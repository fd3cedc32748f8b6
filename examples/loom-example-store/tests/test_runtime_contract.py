"""The kit's runtime suite over ``example://``: real workflows through ``loom_runtime.Loom``
on the store (from ``loom-conformance[runtime]``)."""

from loom_conformance.suites.runtime import TestRuntimeContract

__all__ = ["TestRuntimeContract"]
