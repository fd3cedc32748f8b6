"""A tiny third-party Loom store plugin: a dict-backed event store offering two of the
optional methods (``acquire_fence``, ``acquire_fence_if``) and refusing the rest.

It exists to show a store author the whole path: an entry point, a hook registering a
URL scheme (``example://``), a factory, :class:`~loom_core.spi.RefusesUnoffered` for the
methods it does not offer, and the conformance kit run through one fixture.
"""

from loom_example_store.plugin import open_example
from loom_example_store.store import DictEventStore

__all__ = ["DictEventStore", "open_example"]
