"""The :class:`KeyStore` SPI: one AES-256 data key per subject, destroyable with proof.

A key store lives **outside** the event database: a backup of the log must not carry the
keys (a key backup that outlives ``shred_subject`` resurrects what it shredded).
Implement it over a KMS, a vault or an HSM; :class:`~loom_crypto.MemoryKeyStore` and
:class:`~loom_crypto.FileKeyStore` are the two that ship. A sketch over a KMS::

    class KmsKeyStore:
        async def create(self, subject):
            row = await db.fetch_subject(subject)             # your own small table
            if row and row.destroyed: raise KeyDestroyedError(row.key_id)
            if row: return await self.get(row.key_id)
            wrapped = await kms.generate_data_key(KEK_ID)     # plaintext + wrapped copy
            if not await db.insert_if_absent(subject, new_key_id, wrapped.ciphertext):
                return await self.create(subject)             # lost a race: use theirs
            return DataKey(new_key_id, wrapped.plaintext)
        async def get(self, key_id):        # unwrap with the KMS (cache it briefly)
        async def key_id_for(self, subject):
        async def destroy(self, key_id):    # delete the wrapped key, write the tombstone
        async def was_destroyed(self, key_id):  # true only when the tombstone is durable

Every method is safe to call concurrently, from several processes sharing the store.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar, runtime_checkable

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from typing_extensions import get_protocol_members

from loom_core import LoomError
from loom_crypto.errors import KeyStoreUnavailableError

__all__ = ["KEY_BYTES", "DataKey", "KeyStore", "ask_key_store"]

_T = TypeVar("_T")

KEY_BYTES: Final = 32
"""AES-256: every data key is 32 bytes."""


@dataclass(frozen=True, slots=True, repr=False)
class DataKey:
    """A data key: an opaque ``key_id`` (stored in the log, so it must not name the subject)
    and its 32 secret bytes. ``repr`` never shows the bytes.

    The AES-GCM context of the bytes is built on first use and kept with the key (building
    it costs more than sealing a small payload with it), so a key store that hands out the
    same ``DataKey`` for a subject builds it once. It goes when the key goes; a copy or a
    pickle carries the id and the bytes only.
    """

    key_id: str
    material: bytes
    _aead: AESGCM | None = field(default=None, init=False, repr=False, compare=False)

    def aead(self) -> AESGCM:
        """The AES-GCM context of :attr:`material` (ValueError if it is not a valid AES key
        size)."""
        aead = self._aead
        if aead is None:
            aead = AESGCM(self.material)
            object.__setattr__(self, "_aead", aead)
        return aead

    def __reduce__(self) -> tuple[type[DataKey], tuple[str, bytes]]:
        return DataKey, (self.key_id, self.material)

    def __repr__(self) -> str:
        return f"DataKey(key_id={self.key_id!r}, material=<{len(self.material)} bytes>)"


@runtime_checkable
class KeyStore(Protocol):
    """Per-subject data keys with provable destruction.

    - ``create(subject)``: the subject's key, created on first use; the same key on every
      later call. Refuses with :class:`~loom_crypto.KeyDestroyedError` once the subject's key
      was destroyed: a shredded subject never gets a fresh key, so a write that was not
      quiesced before the erasure fails loudly instead of sealing under a new key.
    - ``get(key_id)``: the key, or :class:`~loom_crypto.KeyDestroyedError` /
      :class:`~loom_crypto.KeyNotFoundError`.
    - ``key_id_for(subject)``: the id of the subject's key, live or destroyed; ``None`` if
      it never had one. Creates nothing.
    - ``destroy(key_id)``: erase the key bytes and persist a destroy tombstone; ``True`` if
      this call destroyed it, ``False`` if it already was; KeyNotFoundError if unknown.
    - ``was_destroyed(key_id)``: ``True`` only when a destroy tombstone is durably on
      record. This is the proof ``shred_subject`` requires before it writes
      PAYLOAD_SHREDDED; ``False`` for a live or unknown key.
    """

    async def create(self, subject: str) -> DataKey: ...

    async def get(self, key_id: str) -> DataKey: ...

    async def key_id_for(self, subject: str) -> str | None: ...

    async def destroy(self, key_id: str) -> bool: ...

    async def was_destroyed(self, key_id: str) -> bool: ...


def key_store_lacks(value: object) -> list[str]:
    """The :class:`KeyStore` methods ``value`` lacks, sorted; empty when it has them all.

    hasattr, not isinstance: from Python 3.12 on, isinstance() of a protocol looks
    attributes up statically, and so refuses a key store that forwards its methods through
    ``__getattr__`` (a proxy around a KMS client, a test double), which it accepted before;
    hasattr accepts it on every version.
    """
    return sorted(m for m in get_protocol_members(KeyStore) if not hasattr(value, m))


async def ask_key_store(call: Awaitable[_T], operation: str, then: str | None = None) -> _T:
    """What a key store answers to ``call``; an error of its own that is not a Loom error (a
    KMS client's) as :class:`~loom_crypto.KeyStoreUnavailableError`, so a caller meets it as
    the storage being unavailable, never as a bare driver error. ``then`` says what to do."""
    try:
        return await call
    except LoomError:
        raise
    except Exception as exc:
        if then is None:
            raise KeyStoreUnavailableError(operation, exc) from exc
        raise KeyStoreUnavailableError(operation, exc, then) from exc
