"""The stored-payload format, version 2: every payload authenticated for the event, and the
incarnation of the log, that hold it.

Every payload the decorator writes is one of two JSON objects. A **sealed** payload (its
subject has a key)::

    {"$loom_sealed": 2, "kid": "<key id>", "n": "<96-bit nonce, base64>",
     "ct": "<ciphertext and 128-bit tag, base64>"}

is AES-256-GCM over the payload's compact JSON text (UTF-8), with the associated data the canonical
JSON of ``["loom-crypto", 2, execution_id, sequence, kind, kid, incarnation]``. A **clear**
payload (``subject_of`` returned ``None``, or a shred marker)::

    {"$loom_clear": 2, "kid": "<integrity key id>", "mac": "<HMAC-SHA256, base64>",
     "json": "<the payload's compact JSON text>"}

carries its payload readable in the database, and an HMAC-SHA256 under the decorator's
integrity key (the key of the reserved subject :data:`INTEGRITY_SUBJECT`) over the
canonical JSON of ``["loom-crypto-clear", 2, execution_id, sequence, kind, kid,
incarnation, json]``. The payload is kept as text so the MAC covers exactly the bytes that
were written, whatever a store's JSON type does to numbers (PostgreSQL ``jsonb`` turns
``1.0`` into ``1``). HMAC, not a GCM tag over empty plaintext, because one integrity key
authenticates every clear payload of the store, and random-nonce GCM is bounded to 2**32
uses per key; HMAC has no nonce and no such bound.

``incarnation`` is a random 128-bit id the decorator draws when it writes an execution's
sequence 0 and stamps in the metadata of every event of that log
(:data:`INCARNATION_FIELD`); see :mod:`loom_crypto.store` for how it is checked. A copy of
a row from a deleted log does not authenticate in the re-created one: the new log's
incarnation differs, and a payload pasted under the new row's metadata fails its tag or MAC.

Format 1 (loom-crypto 0.1) sealed with ``["loom-crypto", 1, execution_id, sequence, kind,
kid]`` and stored clear payloads bare; :func:`open_payload` opens it only for a decorator
opened with ``legacy_reads=True`` (see docs/crypto.md, "Logs written by 0.1").

Nonces are 96 random bits from the OS CSPRNG, fresh for every seal, never derived from the
event: a deleted and re-created execution id, or a retried append, must never repeat a
(key, nonce) pair, and only randomness guarantees that without state. The bound: NIST SP
800-38D allows at most 2**32 random-nonce encryptions under one key, which keeps the chance
of any nonce repeat below 2**-32. Keys are per subject, so the bound is 2**32 sealed events
per subject (about 4.3 billion), far beyond any one person's log; it is documented, not
counted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import orjson
from cryptography.exceptions import InvalidTag

from loom_core import JsonObject, JsonValue
from loom_core.errors import InvalidEventError
from loom_core.spi import canonical_json, json_text
from loom_crypto.errors import PayloadAuthenticationError
from loom_crypto.keys import KEY_BYTES, DataKey

__all__ = [
    "CLEAR_MARKER",
    "FORMAT_VERSION",
    "INCARNATION_FIELD",
    "INTEGRITY_SUBJECT",
    "LEGACY_FORMAT_VERSION",
    "MAX_SEALS_PER_KEY",
    "NONCE_BYTES",
    "SEALED_MARKER",
    "Clear",
    "Sealed",
    "associated_data",
    "authenticate_clear",
    "is_clear",
    "is_sealed",
    "new_incarnation",
    "open_clear",
    "open_payload",
    "parse_clear",
    "parse_sealed",
    "refuse_reserved",
    "seal_payload",
]

SEALED_MARKER: Final = "$loom_sealed"
"""The key that marks a sealed payload; reserved in every payload object."""
CLEAR_MARKER: Final = "$loom_clear"
"""The key that marks an authenticated clear payload; reserved in every payload object."""
INCARNATION_FIELD: Final = "$loom_incarnation"
"""The metadata key holding the log's incarnation id; reserved in every event's metadata."""
INTEGRITY_SUBJECT: Final = "$loom-crypto/integrity"
"""The reserved subject whose key authenticates clear payloads. ``subject_of`` may not
return it and ``shred_subject`` refuses it: destroying it would make every clear payload
unreadable."""
FORMAT_VERSION: Final = 2
LEGACY_FORMAT_VERSION: Final = 1
NONCE_BYTES: Final = 12
MAC_BYTES: Final = 32
MAX_SEALS_PER_KEY: Final = 2**32
"""The random-nonce bound of NIST SP 800-38D (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Sealed:
    """A parsed sealed payload (``version`` 2, or 1 for a format-1 one)."""

    key_id: str
    nonce: bytes
    ciphertext: bytes
    version: int = FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class Clear:
    """A parsed clear payload: its JSON text and the MAC that binds it."""

    key_id: str
    mac: bytes
    text: str


def _text(data: bytes) -> str:
    """``base64.b64encode(data).decode("ascii")``, without its Python frame."""
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def new_incarnation() -> str:
    """A fresh incarnation id: 128 random bits, hex."""
    return secrets.token_hex(16)


def associated_data(
    execution_id: str, sequence: int, kind: str, key_id: str, incarnation: str | None
) -> bytes:
    """What a ciphertext is bound to (``incarnation`` ``None``: format 1, which bound none).
    JSON escaping keeps the fields unambiguous."""
    bound: list[JsonValue] = (
        ["loom-crypto", LEGACY_FORMAT_VERSION, execution_id, sequence, kind, key_id]
        if incarnation is None
        else ["loom-crypto", FORMAT_VERSION, execution_id, sequence, kind, key_id, incarnation]
    )
    return bound_json(bound)


def bound_json(bound: list[JsonValue]) -> bytes:
    """``canonical_json(bound)`` as UTF-8, for a list of strings and integers (what a tag
    or a MAC binds). orjson writes such a list byte for byte as canonical_json does
    (compact, every string escaped alike), in a fraction of the time; what it refuses (a
    lone surrogate, an integer beyond 64 bits) goes to canonical_json."""
    try:
        return orjson.dumps(bound)
    except orjson.JSONEncodeError:
        return canonical_json(bound).encode("utf-8")


def _clear_mac(
    key: DataKey, execution_id: str, sequence: int, kind: str, incarnation: str, text: str
) -> bytes:
    bound: list[JsonValue] = [
        "loom-crypto-clear", FORMAT_VERSION, execution_id, sequence, kind, key.key_id,
        incarnation, text,
    ]
    message = bound_json(bound)
    return hmac.new(key.material, message, hashlib.sha256).digest()


def is_sealed(payload: JsonValue) -> bool:
    return isinstance(payload, dict) and SEALED_MARKER in payload


def is_clear(payload: JsonValue) -> bool:
    return isinstance(payload, dict) and CLEAR_MARKER in payload


_NOT_OBJECTS: Final = frozenset({list, str, int, float, bool, type(None)})


def refuse_reserved(payload: JsonValue, metadata: Mapping[str, JsonValue], where: str) -> None:
    """Refuse a payload object that uses a reserved marker key (it would be read back as an
    envelope) and metadata that sets the incarnation field (the decorator writes it)."""
    # A checked payload is a plain dict, or not an object at all: the ABC check (slow) is
    # only for a payload handed in unchecked.
    if isinstance(payload, dict) or (
        type(payload) not in _NOT_OBJECTS and isinstance(payload, Mapping)
    ):
        for marker in (SEALED_MARKER, CLEAR_MARKER):
            if marker in payload:
                raise InvalidEventError(
                    f"{where}.payload uses the reserved key {marker!r} (loom-crypto marks "
                    "the payloads it stores with it); rename that key"
                )
    if INCARNATION_FIELD in metadata:
        raise InvalidEventError(
            f"{where}.metadata uses the reserved key {INCARNATION_FIELD!r}; the crypto "
            "decorator writes it"
        )


def seal_payload(
    key: DataKey,
    payload: JsonValue,
    *,
    execution_id: str,
    sequence: int,
    kind: str,
    incarnation: str,
    text: str | None = None,
) -> JsonObject:
    """Seal ``payload`` for the event at (``execution_id``, ``sequence``, ``kind``) of the
    log ``incarnation``: its JSON ``text`` when the caller has it (the kernel's check wrote
    it), else :func:`~loom_core.spi.json_text` of it (keys in their order)."""
    plaintext = (json_text(payload) if text is None else text).encode("utf-8")
    nonce = secrets.token_bytes(NONCE_BYTES)
    aad = associated_data(execution_id, sequence, kind, key.key_id, incarnation)
    ciphertext = key.aead().encrypt(nonce, plaintext, aad)
    sealed: JsonObject = {
        SEALED_MARKER: FORMAT_VERSION,
        "kid": key.key_id,
        "n": _text(nonce),
        "ct": _text(ciphertext),
    }
    return sealed


def authenticate_clear(
    key: DataKey,
    payload: JsonValue,
    *,
    execution_id: str,
    sequence: int,
    kind: str,
    incarnation: str,
    text: str | None = None,
) -> JsonObject:
    """``payload`` in the clear, as its JSON ``text`` (see :func:`seal_payload`), with its
    MAC under the integrity ``key``."""
    if text is None:
        text = json_text(payload)
    mac = _clear_mac(key, execution_id, sequence, kind, incarnation, text)
    clear: JsonObject = {
        CLEAR_MARKER: FORMAT_VERSION,
        "kid": key.key_id,
        "mac": _text(mac),
        "json": text,
    }
    return clear


def _b64(value: JsonValue) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def parse_sealed(
    payload: JsonObject, *, execution_id: str, sequence: int, legacy: bool = False
) -> Sealed:
    """The parts of a sealed payload; refuses a malformed or unknown-version one, and a
    format-1 one unless ``legacy``."""

    def broken(reason: str, key_id: str | None = None) -> PayloadAuthenticationError:
        return PayloadAuthenticationError(execution_id, sequence, key_id, reason)

    version = payload.get(SEALED_MARKER)
    accepted = (FORMAT_VERSION, LEGACY_FORMAT_VERSION) if legacy else (FORMAT_VERSION,)
    if isinstance(version, bool) or version not in accepted:
        raise broken(
            f"format version {version!r} is not {FORMAT_VERSION} (written by another "
            "loom-crypto, or altered)"
        )
    if set(payload) != {SEALED_MARKER, "kid", "n", "ct"}:
        raise broken(f"unexpected fields {sorted(payload)}")
    key_id = payload["kid"]
    if not isinstance(key_id, str) or not key_id:
        raise broken("its key id is missing")
    raw_nonce, raw_ciphertext = _b64(payload["n"]), _b64(payload["ct"])
    if raw_nonce is None or raw_ciphertext is None:
        raise broken("nonce or ciphertext is not base64 text", key_id)
    if len(raw_nonce) != NONCE_BYTES or len(raw_ciphertext) < 16:
        raise broken("nonce or tag has the wrong length", key_id)
    assert isinstance(version, int)
    return Sealed(key_id, raw_nonce, raw_ciphertext, version)


def parse_clear(payload: JsonObject, *, execution_id: str, sequence: int) -> Clear:
    """The parts of a clear payload; refuses a malformed or unknown-version one."""

    def broken(reason: str, key_id: str | None = None) -> PayloadAuthenticationError:
        return PayloadAuthenticationError(execution_id, sequence, key_id, reason)

    version = payload.get(CLEAR_MARKER)
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise broken(
            f"clear format version {version!r} is not {FORMAT_VERSION} (written by another "
            "loom-crypto, or altered)"
        )
    if set(payload) != {CLEAR_MARKER, "kid", "mac", "json"}:
        raise broken(f"unexpected fields {sorted(payload)}")
    key_id, text = payload["kid"], payload["json"]
    if not isinstance(key_id, str) or not key_id:
        raise broken("its key id is missing")
    mac = _b64(payload["mac"])
    if mac is None or len(mac) != MAC_BYTES:
        raise broken("its MAC is not 32 bytes of base64", key_id)
    if not isinstance(text, str):
        raise broken("its payload is not JSON text", key_id)
    return Clear(key_id, mac, text)


def _check_key_size(key: DataKey, execution_id: str, sequence: int) -> None:
    if len(key.material) != KEY_BYTES:
        raise PayloadAuthenticationError(
            execution_id, sequence, key.key_id, "the key store returned a key of the wrong size"
        )


def open_payload(
    key: DataKey,
    sealed: Sealed,
    *,
    execution_id: str,
    sequence: int,
    kind: str,
    incarnation: str,
) -> JsonValue:
    """Open ``sealed`` as the payload of (``execution_id``, ``sequence``, ``kind``) in the
    log ``incarnation`` (ignored for a format-1 payload, which bound none)."""
    _check_key_size(key, execution_id, sequence)
    bound = None if sealed.version == LEGACY_FORMAT_VERSION else incarnation
    aad = associated_data(execution_id, sequence, kind, sealed.key_id, bound)
    try:
        plaintext = key.aead().decrypt(sealed.nonce, sealed.ciphertext, aad)
    except InvalidTag:
        raise PayloadAuthenticationError(
            execution_id, sequence, sealed.key_id,
            "the tag does not match this event's execution id, sequence, kind, key id and "
            "incarnation",
        ) from None
    value: JsonValue = json.loads(plaintext.decode("utf-8"))
    return value


def open_clear(
    key: DataKey,
    clear: Clear,
    *,
    execution_id: str,
    sequence: int,
    kind: str,
    incarnation: str,
) -> JsonValue:
    """The payload of ``clear``, once its MAC matches (``execution_id``, ``sequence``,
    ``kind``, ``incarnation``) under the integrity ``key``."""
    _check_key_size(key, execution_id, sequence)
    expected = _clear_mac(key, execution_id, sequence, kind, incarnation, clear.text)
    if not hmac.compare_digest(expected, clear.mac):
        raise PayloadAuthenticationError(
            execution_id, sequence, clear.key_id,
            "the MAC does not match this event's execution id, sequence, kind, incarnation "
            "and clear payload",
        )
    try:
        value: JsonValue = json.loads(clear.text)
    except ValueError:  # a MAC we wrote never covers text we did not produce
        raise PayloadAuthenticationError(
            execution_id, sequence, clear.key_id, "its clear payload is not JSON"
        ) from None
    return value
