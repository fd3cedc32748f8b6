"""The conformance kit through the documented stack, crypto above the audit chain
(``decorators=["audit", ("crypto", ...)]``), over an inner memory store offering every
optional method and over one offering none."""

from __future__ import annotations

import pytest
from loom_conformance import StorageFactory
from loom_conformance.suites import (
    TestEventStoreContract,
    TestLeaseStoreContract,
    TestTimerStoreContract,
)
from loom_crypto import MemoryKeyStore

from loom_core import NewEvent, Storage, open_storage

__all__ = ["TestEventStoreContract", "TestLeaseStoreContract", "TestTimerStoreContract"]

INNER: dict[str, dict[str, object]] = {"full": {}, "bare": {"offer": ()}}


def _subject(execution_id: str, event: NewEvent) -> str:
    return execution_id


@pytest.fixture(params=sorted(INNER), ids=lambda inner: f"audit-then-crypto-over-{inner}-memory")
def loom_storage_factory(request: pytest.FixtureRequest) -> StorageFactory:
    backend_options = INNER[request.param]

    async def open_stack() -> Storage:
        crypto = ("crypto", {"key_store": MemoryKeyStore(), "subject_of": _subject})
        return await open_storage(
            "memory://", decorators=["audit", crypto], options=backend_options
        )

    return open_stack
