"""The contract suites. Import the classes into a test module and pytest collects them::

    from loom_conformance.suites import (
        TestEventStoreContract,
        TestLeaseStoreContract,
        TestTimerStoreContract,
    )

They run against whatever the ``loom_storage_factory`` fixture opens (``memory://`` unless
a ``conftest.py`` overrides it). ``TestDecoratorContract`` checks every registered
decorator's decisions (see :mod:`loom_conformance.decorating`).

The runtime suite is imported from its own module, because it needs loom-runtime (the
``runtime`` extra) and this package must not::

    from loom_conformance.suites.runtime import TestRuntimeContract
"""

from loom_conformance.suites.decorators import TestDecoratorContract
from loom_conformance.suites.events import TestEventStoreContract
from loom_conformance.suites.leases import TestLeaseStoreContract
from loom_conformance.suites.timers import TestTimerStoreContract

__all__ = [
    "TestDecoratorContract",
    "TestEventStoreContract",
    "TestLeaseStoreContract",
    "TestTimerStoreContract",
]
