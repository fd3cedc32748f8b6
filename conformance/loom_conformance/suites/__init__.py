"""The contract suites. Import the classes into a test module and pytest collects them::

    from loom_conformance.suites import (
        TestEventStoreContract,
        TestLeaseStoreContract,
        TestTimerStoreContract,
    )

They run against whatever the ``loom_storage_factory`` fixture opens (``memory://`` unless
a ``conftest.py`` overrides it).
"""

from loom_conformance.suites.events import TestEventStoreContract

__all__ = ["TestEventStoreContract"]
