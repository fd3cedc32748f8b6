"""A key store that hands out a key of the wrong size: the write is refused before anything
is stored, since every read would refuse what it sealed."""

from __future__ import annotations

import pytest
from loom_crypto import (
    KEY_BYTES,
    CryptoEventStore,
    DataKey,
    KeyStoreError,
    MemoryKeyStore,
    ScopedKeyStore,
)

from loom_core import NewEvent
from loom_core.memory import MemoryEventStore


class _ShortKeys(MemoryKeyStore):
    """Hands out the first 16 bytes of each key (AES-128, which AES-GCM would accept)."""

    async def create(self, subject: str) -> DataKey:
        key = await super().create(subject)
        return DataKey(key.key_id, key.material[:16])

    async def get(self, key_id: str) -> DataKey:
        key = await super().get(key_id)
        return DataKey(key.key_id, key.material[:16])


def _sealed_or_clear(execution_id: str, event: NewEvent) -> str | None:
    return None if execution_id.startswith("public/") else execution_id


@pytest.mark.parametrize("execution_id", ["alice/1", "public/1"], ids=["sealed", "clear"])
@pytest.mark.parametrize("scoped", [False, True], ids=["bare", "scoped"])
async def test_a_key_of_the_wrong_size_is_refused_before_anything_is_written(
    execution_id: str, scoped: bool
) -> None:
    inner = MemoryEventStore()
    keys = ScopedKeyStore(_ShortKeys(), scope="acme") if scoped else _ShortKeys()
    store = CryptoEventStore(inner, key_store=keys, subject_of=_sealed_or_clear)

    with pytest.raises(KeyStoreError, match=f"of 16 bytes .* {KEY_BYTES} bytes") as caught:
        await store.append(execution_id, [NewEvent("X", {"a": 1})], expected_sequence=0)

    assert "nothing was written" in str(caught.value)
    assert await inner.head(execution_id) == 0
    assert list(await inner.list_executions()) == []
