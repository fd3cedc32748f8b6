"""The sealed-payload format, version 1: AES-256-GCM bound to the event that holds it.

A sealed payload replaces the event's payload with a JSON object::

    {"$loom_sealed": 1, "kid": "<key id>", "n": "<96-bit nonce, base64>",
     "ct": "<ciphertext and 128-bit tag, base64>"}

The plaintext is the payload's canonical JSON. The associated data is the canonical JSON of
``["loom-crypto", 1, execution_id, sequence, kind, kid]``: GCM authenticates it without
storing it, so a ciphertext copied to another execution, another sequence, another kind, or
given another ``kid`` fails to open (:class:`~loom_crypto.PayloadAuthenticationError`). The
event's kind and metadata stay plaintext: fences, sequences and the ADR 0118
classification keep working on a sealed (or shredded) log.

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
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from loom_core.errors import InvalidEventError
from loom_core.events import JsonObject, JsonValue
from loom_core.validation import canonical_json
from loom_crypto.errors import PayloadAuthenticationError
from loom_crypto.keys import KEY_BYTES, DataKey

__all__ = [
    "FORMAT_VERSION",
    "MAX_SEALS_PER_KEY",
    "NONCE_BYTES",
    "SEALED_MARKER",
    "Sealed",
    "associated_data",
    "is_sealed",
    "open_payload",
    "parse_sealed",
    "refuse_reserved",
    "seal_payload",
]

SEALED_MARKER: Final = "$loom_sealed"
"""The key that marks a sealed payload; reserved in every payload object."""
FORMAT_VERSION: Final = 1
NONCE_BYTES: Final = 12
MAX_SEALS_PER_KEY: Final = 2**32
"""The random-nonce bound of NIST SP 800-38D (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Sealed:
    """A parsed sealed payload."""

    key_id: str
    nonce: bytes
    ciphertext: bytes


def associated_data(execution_id: str, sequence: int, kind: str, key_id: str) -> bytes:
    """What a ciphertext is bound to. JSON escaping keeps the fields unambiguous."""
    bound: JsonValue = ["loom-crypto", FORMAT_VERSION, execution_id, sequence, kind, key_id]
    return canonical_json(bound).encode("utf-8")


def is_sealed(payload: JsonValue) -> bool:
    return isinstance(payload, dict) and SEALED_MARKER in payload


def refuse_reserved(payload: JsonValue, where: str) -> None:
    """Refuse a plaintext payload object that uses the reserved marker key: it would be
    read back as a sealed payload."""
    if isinstance(payload, Mapping) and SEALED_MARKER in payload:
        raise InvalidEventError(
            f"{where}.payload uses the reserved key {SEALED_MARKER!r} (loom-crypto marks "
            "sealed payloads with it); rename that key"
        )


def seal_payload(
    key: DataKey, payload: JsonValue, *, execution_id: str, sequence: int, kind: str
) -> tuple[JsonObject, bytes]:
    """Seal ``payload`` for the event at (``execution_id``, ``sequence``, ``kind``).

    Returns the sealed payload object and the plaintext bytes it holds.
    """
    plaintext = canonical_json(payload).encode("utf-8")
    nonce = secrets.token_bytes(NONCE_BYTES)
    aad = associated_data(execution_id, sequence, kind, key.key_id)
    ciphertext = AESGCM(key.material).encrypt(nonce, plaintext, aad)
    sealed: JsonObject = {
        SEALED_MARKER: FORMAT_VERSION,
        "kid": key.key_id,
        "n": base64.b64encode(nonce).decode("ascii"),
        "ct": base64.b64encode(ciphertext).decode("ascii"),
    }
    return sealed, plaintext


def parse_sealed(payload: JsonObject, *, execution_id: str, sequence: int) -> Sealed:
    """The parts of a sealed payload; refuses a malformed or unknown-version one."""

    def broken(reason: str, key_id: str | None = None) -> PayloadAuthenticationError:
        return PayloadAuthenticationError(execution_id, sequence, key_id, reason)

    version = payload.get(SEALED_MARKER)
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise broken(
            f"format version {version!r} is not {FORMAT_VERSION} (written by a newer "
            "loom-crypto, or altered)"
        )
    if set(payload) != {SEALED_MARKER, "kid", "n", "ct"}:
        raise broken(f"unexpected fields {sorted(payload)}")
    key_id, nonce, ciphertext = payload["kid"], payload["n"], payload["ct"]
    if not isinstance(key_id, str) or not key_id:
        raise broken("its key id is missing")
    if not isinstance(nonce, str) or not isinstance(ciphertext, str):
        raise broken("nonce or ciphertext is not base64 text", key_id)
    try:
        raw_nonce = base64.b64decode(nonce, validate=True)
        raw_ciphertext = base64.b64decode(ciphertext, validate=True)
    except (binascii.Error, ValueError):
        raise broken("nonce or ciphertext is not valid base64", key_id) from None
    if len(raw_nonce) != NONCE_BYTES or len(raw_ciphertext) < 16:
        raise broken("nonce or tag has the wrong length", key_id)
    return Sealed(key_id, raw_nonce, raw_ciphertext)


def open_payload(
    key: DataKey, sealed: Sealed, *, execution_id: str, sequence: int, kind: str
) -> JsonValue:
    """Open ``sealed`` as the payload of (``execution_id``, ``sequence``, ``kind``)."""
    if len(key.material) != KEY_BYTES:
        raise PayloadAuthenticationError(
            execution_id, sequence, sealed.key_id, "the key store returned a key of the "
            "wrong size"
        )
    aad = associated_data(execution_id, sequence, kind, sealed.key_id)
    try:
        plaintext = AESGCM(key.material).decrypt(sealed.nonce, sealed.ciphertext, aad)
    except InvalidTag:
        raise PayloadAuthenticationError(
            execution_id, sequence, sealed.key_id,
            "the tag does not match this event's execution id, sequence, kind and key id",
        ) from None
    value: JsonValue = json.loads(plaintext.decode("utf-8"))
    return value
