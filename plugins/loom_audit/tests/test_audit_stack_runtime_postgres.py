"""The kit's runtime suite through the documented stack, crypto above the audit chain,
over PostgreSQL (a fresh schema per storage): workflows replay, park and resume through
both decorators on the server a multi-node deployment runs."""

from __future__ import annotations

import uuid
from typing import Literal

import pytest
from loom_conformance import StorageFactory
from loom_conformance.suites.runtime import TestRuntimeContract
from loom_crypto import MemoryKeyStore

from loom_core import NewEvent, Storage, open_storage

__all__ = ["TestRuntimeContract"]


def _subject(execution_id: str, event: NewEvent) -> str:
    return execution_id


@pytest.fixture
def loom_storage_factory(stack_database: str) -> StorageFactory:
    async def open_stack() -> Storage:
        crypto = ("crypto", {"key_store": MemoryKeyStore(), "subject_of": _subject})
        return await open_storage(
            stack_database,
            decorators=["audit", crypto],
            options={"schema": f"runtime_{uuid.uuid4().hex[:12]}"},
        )

    return open_stack


@pytest.fixture
def loom_explorer_isolation() -> Literal["store", "execution"]:
    return "execution"
