"""Loom's conformance kit: contract suites any store (or decorator) runs unchanged.

A store author overrides one fixture, ``loom_storage_factory``, and imports the suites;
see ``docs/plugin-authors.md``. The public API:

- :data:`StorageFactory`, :func:`memory_factory`: what the suites open stores with;
- :mod:`loom_conformance.suites`: ``TestEventStoreContract``, ``TestTimerStoreContract``,
  ``TestLeaseStoreContract``; :mod:`loom_conformance.suites.runtime`:
  ``TestRuntimeContract``, workflows through loom-runtime (the ``runtime`` extra);
- :mod:`loom_conformance.requirements`: the switch per optional method (``requires``);
- :mod:`loom_conformance.decorating`: running the contract through registered decorators;
- :mod:`loom_conformance.explorer`: the schedule explorer of the conditional acquire.
"""

import pytest

# Before the suites are imported: pytest rewrites the asserts of a plugin's modules only
# when it finds them in an installed distribution's file list, which an editable install
# lacks, and a bare AssertionError tells a store author nothing.
pytest.register_assert_rewrite(
    "loom_conformance.suites",
    "loom_conformance.explorer",
    "loom_conformance.decorating",
    "loom_conformance.drawn_workflows",
)

from loom_conformance.explorer import ExplorationReport, Violation, explore  # noqa: E402
from loom_conformance.factory import StorageFactory, memory_factory  # noqa: E402
from loom_conformance.requirements import Requirements, requires  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ExplorationReport",
    "Requirements",
    "StorageFactory",
    "Violation",
    "__version__",
    "explore",
    "memory_factory",
    "requires",
]
