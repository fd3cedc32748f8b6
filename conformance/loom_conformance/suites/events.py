"""``TestEventStoreContract``: the whole event-store contract in one class to import."""

from __future__ import annotations

import pytest

from loom_conformance.suites.events_fencing import EventStoreFencingContract
from loom_conformance.suites.events_optional import EventStoreOptionalContract
from loom_conformance.suites.events_reference import EventStoreReferenceContract
from loom_conformance.suites.events_refusals import EventStoreRefusalContract
from loom_conformance.suites.events_required import EventStoreRequiredContract
from loom_conformance.suites.explorer import ScheduleExplorerContract

__all__ = ["TestEventStoreContract"]


class TestEventStoreContract(
    EventStoreRequiredContract,
    EventStoreFencingContract,
    EventStoreOptionalContract,
    EventStoreRefusalContract,
    EventStoreReferenceContract,
    ScheduleExplorerContract,
):
    """Every required and optional method, every error with its data, the
    conditional acquire's cases, the unchanged store after every refusal, drawn programs of
    calls answered as the in-memory reference answers them, and the schedule explorer,
    against ``loom_storage_factory``.

    Tests of an optional method run where the store offers it (``capabilities``) and are
    skipped, with a reason, where it does not;
    ``test_optional_method_is_offered_or_refused_with_unsupported`` checks each method's
    branch, so none goes untested.
    """

    pytestmark = pytest.mark.asyncio(loop_scope="function")
