"""Exported chain heads: the anchor that lets a verifier see a truncated tail.

A head names an execution's last event and its link hash at export time. Keep it where
whoever could rewrite the database cannot (a write-once bucket, another database, a signed
ticket): a verifier given the head detects every removed, reordered or rewritten event up
to that sequence, even one whose attacker recomputed every hash after it. Signed heads
(HMAC-SHA256 under a key the audit decorator is opened with) may be stored anywhere,
because they cannot be forged without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from loom_core import JsonObject, JsonValue
from loom_core.errors import InvalidInputError
from loom_core.spi import check_execution_id, check_sequence

__all__ = ["ChainHead", "sign_head"]

_HASH: Final = re.compile(r"[0-9a-f]{64}")


def sign_head(key: bytes, execution_id: str, sequence: int, link: str) -> str:
    """HMAC-SHA256 over the head's fields, hex."""
    message = json.dumps(
        ["loom-audit-head", 1, execution_id, sequence, link],
        separators=(",", ":"), ensure_ascii=False,
    ).encode("utf-8")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class ChainHead:
    """The execution's last event at export: its ``sequence`` and link ``hash``;
    ``signature`` is set when the exporting decorator has a ``head_key``."""

    execution_id: str
    sequence: int
    hash: str
    signature: str | None = None

    def signature_matches(self, key: bytes) -> bool:
        if self.signature is None:
            return False
        expected = sign_head(key, self.execution_id, self.sequence, self.hash)
        return hmac.compare_digest(expected, self.signature)

    def to_json(self) -> JsonObject:
        """A JSON object to store or ship; :meth:`from_json` reads it back."""
        return {
            "execution_id": self.execution_id,
            "sequence": self.sequence,
            "hash": self.hash,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, JsonValue]) -> ChainHead:
        """Refuses (InvalidInputError) anything that is not an exported head."""
        if not isinstance(value, Mapping) or set(value) != {
            "execution_id", "sequence", "hash", "signature"
        }:
            raise InvalidInputError("a chain head is an object with execution_id, sequence, "
                                    "hash and signature")
        execution_id = check_execution_id(value["execution_id"])
        sequence = check_sequence(value["sequence"], "head sequence")
        link, signature = value["hash"], value["signature"]
        if not isinstance(link, str) or not _HASH.fullmatch(link):
            raise InvalidInputError("a chain head's hash is 64 lowercase hex digits")
        if signature is not None and (
            not isinstance(signature, str) or not _HASH.fullmatch(signature)
        ):
            raise InvalidInputError("a chain head's signature is null or 64 lowercase hex digits")
        return cls(execution_id, sequence, link, signature)
