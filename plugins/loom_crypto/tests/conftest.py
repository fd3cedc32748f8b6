"""Fixtures for loom-crypto's own tests: key stores of both kinds, a sealed store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from loom_crypto import CryptoEventStore, FileKeyStore, KeyStore, MemoryKeyStore

from loom_core import NewEvent
from loom_core.memory import MemoryEventStore


def subject_prefix(execution_id: str, event: NewEvent) -> str | None:
    """``alice/order-1`` belongs to alice; an event with ``metadata["subject"]`` names its
    own subject (a log shared by several people); ``public/...`` logs are plaintext."""
    named = event.metadata.get("subject")
    if isinstance(named, str):
        return named
    owner = execution_id.split("/", 1)[0]
    return None if owner == "public" else owner


@pytest.fixture(params=["memory", "file"])
def key_store(request: pytest.FixtureRequest, tmp_path: Path) -> KeyStore:
    if request.param == "memory":
        return MemoryKeyStore()
    return FileKeyStore(tmp_path / "keys")


@pytest.fixture
def inner() -> MemoryEventStore:
    return MemoryEventStore()


@pytest.fixture
async def sealed(inner: MemoryEventStore, key_store: KeyStore) -> AsyncIterator[CryptoEventStore]:
    store = CryptoEventStore(inner, key_store=key_store, subject_of=subject_prefix)
    yield store
    await store.close()
