"""The chain link, format version 1: what each event carries and how it is computed.

Every event written through the audit decorator carries, in ``metadata["chain"]``::

    {"v": 1, "prev": "<hash of its predecessor>", "hash": "<its own link hash>"}

``hash`` is SHA-256 over the canonical JSON of::

    ["loom-audit", 1, execution_id, sequence, kind, payload, metadata, prev]

where ``metadata`` is the event's metadata without the ``chain`` field but *with* the
``fence`` the store stamps (so a rewritten fence stamp breaks the link too), and ``prev`` is
the predecessor's ``hash`` (:data:`GENESIS` for sequence 0). ``recorded_at`` is the store's
clock and is not covered.

Canonical JSON here is compact, key-sorted and UTF-8, with every integral float written as
an integer: a store may hand ``1.0`` or ``1e20`` back as ``1`` or ``100000000000000000000``
(PostgreSQL ``jsonb`` does), and JSON itself does not distinguish them. Its reference
encoder is :func:`json.dumps` (``separators=(",", ":"), sort_keys=True,
ensure_ascii=False``). A value with no float and no integer beyond 64 bits is encoded by
orjson instead, whose output for such values is byte for byte the same (strings escaped
alike, keys sorted by code point); anything orjson refuses, or whose output has the shape
of a float anywhere (a digit followed by ``.``, ``e`` or ``E``, or a ``null``, which is
how orjson writes a NaN; inside a string too), goes to the reference encoder.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import orjson

from loom_core import JsonObject, JsonValue, NewEvent
from loom_core.errors import InvalidEventError
from loom_core.spi import build_new_event

__all__ = [
    "CHAIN_FIELD",
    "FORMAT_VERSION",
    "GENESIS",
    "Link",
    "chain_events",
    "link_hash",
    "read_link",
    "refuse_chain_field",
]

CHAIN_FIELD: Final = "chain"
"""The metadata key that holds the link; reserved for the decorator."""
FORMAT_VERSION: Final = 1
GENESIS: Final = "0" * 64
"""The ``prev`` of an execution's first event (sequence 0)."""


@dataclass(frozen=True, slots=True)
class Link:
    """An event's link: its predecessor's hash (``None`` when the predecessor had been
    truncated away before this event was written) and its own."""

    prev: str | None
    hash: str


def _normalized(value: JsonValue) -> JsonValue:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value


_FLOAT_SHAPE: Final = re.compile(rb"[0-9][.eE]|null")
"""What every float orjson writes contains (``1.5``, ``1e-7``, ``1e+16``; NaN and the
infinities, which the reference encoder refuses, come out as ``null``)."""


_DIGIT_THEN_MARK: Final = bytes(
    ord("0") if byte in b"0123456789" else ord(".") if byte in b".eE" else ord(" ")
    for byte in range(256)
)
"""Every digit to ``0``, every ``.``, ``e`` and ``E`` to ``.``, anything else to a space."""


def _float_shaped(encoded: bytes) -> bool:
    """Whether ``_FLOAT_SHAPE`` occurs in ``encoded``: a digit before ``.``, ``e`` or ``E``
    is ``0.`` once translated (one pass in C, where the pattern's search tries every
    position)."""
    return encoded.translate(_DIGIT_THEN_MARK).find(b"0.") >= 0 or encoded.find(b"null") >= 0


def _reference(value: JsonValue) -> bytes:
    return json.dumps(
        _normalized(value), separators=(",", ":"), sort_keys=True, ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def _plain(value: str | int | None) -> bytes:
    """A string, an integer or null, which orjson writes exactly as the reference encoder
    does (it refuses an integer beyond 64 bits and a lone surrogate: those go there)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _reference(value)


def _canonical(value: JsonValue) -> bytes:
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return _reference(value)
    if _float_shaped(encoded):
        # A float (to write integral ones as integers, others as json.dumps does, and
        # refuse a NaN), or only a null or a string that looks like one: the reference
        # encoder decides either way.
        return _reference(value)
    return encoded


_PREFIX: Final = _reference(["loom-audit", FORMAT_VERSION])[:-1] + b","


def link_hash(
    execution_id: str,
    sequence: int,
    kind: str,
    payload: JsonValue,
    metadata: Mapping[str, JsonValue],
    prev: str | None,
) -> str:
    """The link hash of one event; the chain field of ``metadata``, if any, is left out."""
    covered: JsonObject = (
        metadata  # only read
        if isinstance(metadata, dict) and CHAIN_FIELD not in metadata
        else without_chain(metadata)
    )
    # The canonical JSON of the list, element by element (compact: joined by commas), so
    # only the payload and the metadata are searched for floats, not the hex of ``prev``.
    encoded = b"".join((
        _PREFIX, _address(execution_id, sequence, kind), b",",
        _canonical(payload), b",", _canonical(covered), b",", _plain(prev), b"]",
    ))
    return hashlib.sha256(encoded).hexdigest()


def _address(execution_id: str, sequence: int, kind: str) -> bytes:
    """``execution_id``, ``sequence`` and ``kind`` as the list's elements (joined by
    commas): one orjson call, which writes them as the reference encoder does unless it
    refuses one (each is then written on its own)."""
    try:
        return orjson.dumps([execution_id, sequence, kind])[1:-1]
    except orjson.JSONEncodeError:
        return b",".join((_plain(execution_id), _plain(sequence), _plain(kind)))


def without_chain(metadata: Mapping[str, JsonValue]) -> JsonObject:
    """A copy of ``metadata`` without its chain field (if it has one)."""
    kept = dict(metadata)
    kept.pop(CHAIN_FIELD, None)
    return kept


def read_link(metadata: Mapping[str, JsonValue]) -> Link | None:
    """The link in ``metadata``, or ``None`` when it is missing or malformed."""
    field = metadata.get(CHAIN_FIELD)
    if not isinstance(field, dict) or field.get("v") != FORMAT_VERSION:
        return None
    prev, own = field.get("prev"), field.get("hash")
    if not isinstance(own, str) or not (prev is None or isinstance(prev, str)):
        return None
    if set(field) != {"v", "prev", "hash"}:
        return None
    return Link(prev, own)


def refuse_chain_field(events: Sequence[NewEvent], where: str = "events") -> None:
    """Refuse user metadata that sets the reserved ``chain`` key."""
    for i, event in enumerate(events):
        if CHAIN_FIELD in event.metadata:
            raise InvalidEventError(
                f"{where}[{i}].metadata uses the reserved key {CHAIN_FIELD!r}; the audit "
                "decorator writes it"
            )


def chain_events(
    execution_id: str,
    first_sequence: int,
    events: Sequence[NewEvent],
    prev: str | None,
    fence: int | None,
) -> list[NewEvent]:
    """``events`` with their links, for sequences ``first_sequence, …``, after ``prev``.

    ``fence`` is the token the store will stamp (``append(fence=…)``), which the hash
    covers; ``None`` for an unfenced or conditional append, which stamps nothing.
    """
    chained: list[NewEvent] = []
    for offset, event in enumerate(events):
        covered: JsonObject = dict(event.metadata)
        if fence is not None:
            covered["fence"] = fence
        own = link_hash(
            execution_id, first_sequence + offset, event.kind, event.payload, covered, prev
        )
        metadata: JsonObject = dict(event.metadata)
        metadata[CHAIN_FIELD] = {"v": FORMAT_VERSION, "prev": prev, "hash": own}
        chained.append(build_new_event(event.kind, event.payload, metadata))
        prev = own
    return chained
