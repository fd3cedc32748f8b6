"""An in-memory :class:`~loom_crypto.KeyStore`: for tests and for logs that die with the
process (``memory://``). Keys and tombstones are gone when the process exits.

Like the in-memory stores (docs/design.md, "When the in-memory stores let other tasks
run"), it waits on nothing, so it decides when other tasks run: one call in
:data:`YIELD_EVERY`, its first call among them, yields to the event loop once before doing
its work; each call is one synchronous step after that point."""

from __future__ import annotations

import asyncio
import secrets
from typing import Final

from loom_core.spi import check_key
from loom_crypto.errors import KeyDestroyedError, KeyNotFoundError
from loom_crypto.keys import KEY_BYTES, DataKey

__all__ = ["YIELD_EVERY", "MemoryKeyStore"]

YIELD_EVERY: Final = 16


class MemoryKeyStore:
    """Process-local keys. A destroyed key's bytes are dropped; its tombstone stays."""

    def __init__(self) -> None:
        self._subjects: dict[str, str] = {}
        # key id -> its key (immutable, so every call hands out the same one), or None
        # once destroyed (the tombstone).
        self._keys: dict[str, DataKey | None] = {}
        self._turns = 1  # calls left until the next yield: the first call yields

    def _yields(self) -> bool:
        """Whether this call is the one in :data:`YIELD_EVERY` that yields."""
        self._turns -= 1
        if self._turns:
            return False
        self._turns = YIELD_EVERY
        return True

    async def create(self, subject: str) -> DataKey:
        subject = check_key(subject, "subject")
        if self._yields():
            await asyncio.sleep(0)
        key_id = self._subjects.get(subject)
        if key_id is None:
            key_id = secrets.token_hex(16)
            self._subjects[subject] = key_id
            self._keys[key_id] = DataKey(key_id, secrets.token_bytes(KEY_BYTES))
        return self._key(key_id)

    async def get(self, key_id: str) -> DataKey:
        key_id = check_key(key_id, "key id")
        if self._yields():
            await asyncio.sleep(0)
        return self._key(key_id)

    def _key(self, key_id: str) -> DataKey:
        if key_id not in self._keys:
            raise KeyNotFoundError(key_id)
        key = self._keys[key_id]
        if key is None:
            raise KeyDestroyedError(key_id)
        return key

    async def key_id_for(self, subject: str) -> str | None:
        subject = check_key(subject, "subject")
        if self._yields():
            await asyncio.sleep(0)
        return self._subjects.get(subject)

    async def destroy(self, key_id: str) -> bool:
        key_id = check_key(key_id, "key id")
        if self._yields():
            await asyncio.sleep(0)
        if key_id not in self._keys:
            raise KeyNotFoundError(key_id)
        if self._keys[key_id] is None:
            return False
        self._keys[key_id] = None
        return True

    async def was_destroyed(self, key_id: str) -> bool:
        key_id = check_key(key_id, "key id")
        if self._yields():
            await asyncio.sleep(0)
        return key_id in self._keys and self._keys[key_id] is None
