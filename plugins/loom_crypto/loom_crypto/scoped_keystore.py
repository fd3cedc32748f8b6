"""A :class:`~loom_crypto.KeyStore` seen through one scope (a tenant) of a key store that
several scopes share: one KMS for every tenant, each tenant's keys its own.

``ScopedKeyStore(inner, scope="acme")`` gives each subject of the scope a subject of its
own in ``inner``, ``$loom-scope/<len(scope)>:<scope>/<subject>`` (so ``acme``'s
``order-42`` and ``zeta``'s ``order-42`` are two subjects with two keys, and no scope's
subject can be spelt as another's), and hands out each key of ``inner`` with its bytes
derived for the scope: HKDF-SHA256 of the inner key's bytes, its info the canonical JSON of
``["loom-crypto-scope", 1, scope]``. The key ids stay those of ``inner``.

The derivation is what keeps a row of one scope from authenticating in another: a tag or
a MAC made under ``acme``'s bytes for a key does not verify under ``zeta``'s bytes for that
same key id, so a row copied from one tenant's log to the other's (same ids, sequences,
kinds) is refused with :class:`~loom_crypto.PayloadAuthenticationError`, even though
``get`` answers any key id of the shared store.

``destroy`` is confined to the scope: it destroys only a key this store's ``key_id_for``
has named for one of the scope's subjects (the last :data:`OWN_KEYS_KEPT` it named), and
refuses any other id with :class:`~loom_crypto.KeyOutOfScopeError`, destroying nothing.
The key store SPI cannot say which subject a key id belongs to, so an id learnt elsewhere
(a row of another tenant's log, or this scope's own key as ``create`` handed it out or
another process looked it up) is refused until this store's ``key_id_for`` has named it;
``shred_subject`` looks the key up first, so it always can.
Destroying a key destroys it in ``inner``, for every derivation of it: shredding is per
subject, and each scope's subjects are its own.

A payload sealed under a key store used without a scope (the inner key's own bytes) does
not open through a scoped one, nor the other way round.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from typing import Final, final

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from loom_core.errors import InvalidOptionError, LoomError
from loom_core.spi import canonical_json, check_key
from loom_crypto.errors import KeyDestroyedError, KeyNotFoundError, KeyOutOfScopeError
from loom_crypto.keys import KEY_BYTES, DataKey, KeyStore, key_store_lacks

__all__ = ["OWN_KEYS_KEPT", "SCOPE_PREFIX", "ScopedKeyStore"]

SCOPE_PREFIX: Final = "$loom-scope/"
"""What starts every subject a :class:`ScopedKeyStore` names in its inner key store."""

_DERIVED_KEPT: Final = 4096

OWN_KEYS_KEPT: Final = 4096
"""How many of the scope's key ids (the most recently named by ``key_id_for``) a
:class:`ScopedKeyStore` keeps as destroyable; an older one is named again by
``key_id_for``."""


@final
class ScopedKeyStore:
    """``inner``'s keys for the subjects of ``scope`` only, with bytes of their own (see the
    module docstring). Every call goes to ``inner``: a key is handed out only for the bytes
    ``inner`` has just handed out, so a key destroyed elsewhere is noticed as before, and its
    derivation is dropped once ``inner`` says it is destroyed or unknown."""

    __slots__ = ("_derived", "_info", "_own", "_prefix", "inner", "scope")

    def __init__(self, inner: KeyStore, *, scope: str) -> None:
        lacking = key_store_lacks(inner)
        if lacking:
            raise InvalidOptionError(
                f"inner must implement loom_crypto.KeyStore, got {type(inner).__name__}, "
                f"which lacks {', '.join(lacking)}"
            )
        if not isinstance(scope, str):
            raise InvalidOptionError(f"scope must be a str (a tenant's name), not {scope!r}")
        if scope:  # the empty name is a scope of its own, as it is a tenant of its own
            try:
                check_key(scope, "scope")
            except LoomError as exc:
                raise InvalidOptionError(
                    f"scope {scope!r} is refused: {exc}; name it without control characters, "
                    "in at most 512 UTF-8 bytes"
                ) from exc
        self.inner = inner
        self.scope = scope
        self._prefix = f"{SCOPE_PREFIX}{len(scope)}:{scope}/"
        self._info = canonical_json(["loom-crypto-scope", 1, scope]).encode("utf-8")
        # key id -> (digest of inner's bytes, their derivation): the derived DataKey is
        # handed out again while inner hands out the same bytes, so its AES-GCM context is
        # built once; inner's own bytes are not kept.
        self._derived: OrderedDict[str, tuple[bytes, DataKey]] = OrderedDict()
        # The key ids key_id_for named for subjects of this scope: the only ones destroy
        # takes. Not those create hands out: sealing calls create for every subject it
        # writes, which would push out the one a shred has just looked up.
        self._own: OrderedDict[str, None] = OrderedDict()

    def __repr__(self) -> str:
        return f"ScopedKeyStore({self.inner!r}, scope={self.scope!r})"

    def _subject(self, subject: str) -> str:
        subject = check_key(subject, "subject")
        return check_key(self._prefix + subject, f"subject {subject!r} in scope {self.scope!r}")

    def _derive(self, key: DataKey) -> DataKey:
        if len(key.material) != KEY_BYTES:
            return key  # as inner gave it: the decorator refuses a key of the wrong size
        digest = hashlib.sha256(key.material).digest()
        kept = self._derived.get(key.key_id)
        if kept is not None and hmac.compare_digest(kept[0], digest):
            self._derived.move_to_end(key.key_id)
            return kept[1]
        material = HKDF(
            algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=self._info
        ).derive(key.material)
        derived = DataKey(key.key_id, material)
        self._derived[key.key_id] = (digest, derived)
        self._derived.move_to_end(key.key_id)
        if len(self._derived) > _DERIVED_KEPT:
            self._derived.popitem(last=False)
        return derived

    def _owns(self, key_id: str) -> str:
        self._own[key_id] = None
        self._own.move_to_end(key_id)
        if len(self._own) > OWN_KEYS_KEPT:
            self._own.popitem(last=False)
        return key_id

    async def create(self, subject: str) -> DataKey:
        return self._derive(await self.inner.create(self._subject(subject)))

    async def get(self, key_id: str) -> DataKey:
        try:
            key = await self.inner.get(key_id)
        except (KeyDestroyedError, KeyNotFoundError):
            self._derived.pop(key_id, None)
            raise
        return self._derive(key)

    async def key_id_for(self, subject: str) -> str | None:
        key_id = await self.inner.key_id_for(self._subject(subject))
        return None if key_id is None else self._owns(key_id)

    async def destroy(self, key_id: str) -> bool:
        """Destroy ``key_id`` in ``inner``; refuses (:class:`KeyOutOfScopeError`, nothing
        destroyed) a key id this store's ``key_id_for`` has not named for a subject of its
        scope, so no scope destroys another's key."""
        key_id = check_key(key_id, "key id")
        if key_id not in self._own:
            raise KeyOutOfScopeError(key_id, self.scope)
        self._derived.pop(key_id, None)
        return await self.inner.destroy(key_id)

    async def was_destroyed(self, key_id: str) -> bool:
        return await self.inner.was_destroyed(key_id)
