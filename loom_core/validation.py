"""Checks every public entry point runs on its arguments before touching a store.

Each check raises an :class:`~loom_core.errors.InvalidInputError` subclass that says what
was wrong, so a refused call never writes anything.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final, cast

from loom_core.errors import (
    InvalidEventError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    InvalidSequenceError,
)
from loom_core.events import JsonObject, JsonValue, NewEvent
from loom_core.protocols import AppendRequest, Redrive, TimerRecord

__all__ = [
    "MAX_ID_BYTES",
    "MAX_INT_BITS",
    "MAX_POSITION",
    "MAX_KIND_LENGTH",
    "RESERVED_METADATA_KEYS",
    "canonical_json",
    "check_append",
    "check_append_requests",
    "check_aware",
    "check_count",
    "check_events",
    "check_execution_id",
    "check_fence",
    "check_limit",
    "check_read",
    "check_sequence",
    "check_key",
    "check_timer_record",
    "check_ttl",
]

MAX_ID_BYTES: Final = 512
MAX_POSITION: Final = 2**63 - 1
"""The largest sequence, fence, count or limit any call accepts: what every backend can
store (a signed 64-bit integer). A larger value is refused, never clamped."""
MAX_INT_BITS: Final = 14_000
"""The largest JSON integer an event may carry, in bits (about 4,200 decimal digits):
below the 4,300 digits Python will format as text by default, so every store can encode
what the check accepts."""
MAX_KIND_LENGTH: Final = 200
MAX_EVENTS_PER_APPEND: Final = 10_000
RESERVED_METADATA_KEYS: Final = frozenset({"fence"})
# One C-level scan instead of a Python loop per character (every append checks its ids).
_CONTROL: Final = re.compile("[\x00-\x1f\x7f]")


def check_key(value: object, what: str = "execution id") -> str:
    """A non-empty string of at most 512 UTF-8 bytes with no control characters."""
    if not isinstance(value, str):
        raise InvalidExecutionIdError(value, f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidExecutionIdError(value, f"{what} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidExecutionIdError(value, f"{what} contains a lone surrogate") from None
    if size > MAX_ID_BYTES:
        raise InvalidExecutionIdError(value, f"{what} is {size} bytes; the limit is {MAX_ID_BYTES}")
    if _CONTROL.search(value):
        raise InvalidExecutionIdError(value, f"{what} contains a control character (NUL included)")
    return value


def check_execution_id(value: object) -> str:
    return check_key(value, "execution id")


def _check_int(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSequenceError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise InvalidSequenceError(f"{what} must be >= {minimum}, got {value}")
    if value > MAX_POSITION:
        raise InvalidSequenceError(
            f"{what} must be at most 2**63 - 1 (a signed 64-bit integer), got {value}"
        )
    return value


def check_sequence(value: object, what: str = "sequence") -> int:
    """A non-negative int (``bool`` is refused, though it is an ``int``)."""
    return _check_int(value, what, 0)


def check_fence(value: object, what: str = "fence") -> int:
    return _check_int(value, what, 0)


def check_count(value: object, what: str, minimum: int = 0) -> int:
    return _check_int(value, what, minimum)


def check_limit(value: object, what: str = "limit") -> int:
    """A positive int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionError(f"{what} must be an int, not {type(value).__name__}")
    if value < 1:
        raise InvalidOptionError(f"{what} must be >= 1, got {value}")
    if value > MAX_POSITION:
        raise InvalidOptionError(
            f"{what} must be at most 2**63 - 1 (a signed 64-bit integer), got {value}; "
            "pass None for no limit where the method allows it"
        )
    return value


def check_append(
    execution_id: object, events: object, expected_sequence: object
) -> tuple[str, tuple[NewEvent, ...], int]:
    """The arguments every append shares (the fence is checked by the caller), in order."""
    return (
        check_execution_id(execution_id),
        check_events(events),
        check_sequence(expected_sequence, "expected_sequence"),
    )


def check_read(
    execution_id: object, from_sequence: object, to_sequence: object, limit: object
) -> tuple[str, int, int | None, int | None]:
    """The arguments of ``EventStore.read``, checked, in order."""
    return (
        check_execution_id(execution_id),
        check_sequence(from_sequence, "from_sequence"),
        None if to_sequence is None else check_sequence(to_sequence, "to_sequence"),
        None if limit is None else check_limit(limit),
    )


def check_aware(value: object, what: str) -> datetime:
    """A timezone-aware datetime, returned in UTC."""
    if not isinstance(value, datetime):
        raise InvalidOptionError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidOptionError(f"{what} must be timezone-aware (got naive {value.isoformat()})")
    return value.astimezone(UTC)


# Where a value sits inside an event: the root's name, or (parent, key or index). Built as
# tuples while walking and spelled out only for an error, so a valid payload costs no
# string formatting.
_Where = str | tuple["_Where", str | int]


def _where(path: _Where) -> str:
    steps: list[str] = []
    while isinstance(path, tuple):
        path, step = path
        steps.append(f"[{step}]" if isinstance(step, int) else f".{step}")
    steps.append(path)
    return "".join(reversed(steps))


def _check_json(value: object, path: _Where, depth: int = 0) -> JsonValue:
    if depth > 200:
        raise InvalidEventError(f"{_where(path)} nests deeper than 200 levels")
    kind = type(value)
    if kind is str:
        _check_text(cast(str, value), path)
        return cast(str, value)
    if kind is int:
        if cast(int, value).bit_length() > MAX_INT_BITS:
            raise InvalidEventError(_too_big(path))
        return cast(int, value)
    if value is None or kind is bool:
        return cast(JsonValue, value)
    if kind is dict or (kind is not list and isinstance(value, Mapping)):
        out: dict[str, JsonValue] = {}
        for k, v in cast(Mapping[object, object], value).items():
            if type(k) is not str:
                raise InvalidEventError(
                    f"{_where(path)} has a non-string key {k!r}; JSON keys are strings"
                )
            _check_text(k, path, key=True)
            out[k] = _check_json(v, (path, k), depth + 1)
        return out
    if kind is list or isinstance(value, list | tuple):
        return [
            _check_json(v, (path, i), depth + 1)
            for i, v in enumerate(cast(Sequence[object], value))
        ]
    if isinstance(value, str):
        _check_text(value, path)
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise InvalidEventError(_too_big(path))
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEventError(f"{_where(path)} is {value!r}, which JSON cannot represent")
        return value
    raise InvalidEventError(
        f"{_where(path)} is a {type(value).__name__}, which is not a JSON value"
    )


def _too_big(path: _Where) -> str:
    return (
        f"{_where(path)} is an integer of more than {MAX_INT_BITS} bits (about 4,200 "
        "digits), which not every store can encode; store it as a string"
    )


def _check_text(value: str, path: _Where, *, key: bool = False) -> None:
    if "\x00" in value:
        # PostgreSQL jsonb cannot store U+0000; refuse it everywhere so stores agree.
        raise InvalidEventError(
            f"{_label(path, key)} contains U+0000, which JSON stores cannot hold"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidEventError(f"{_label(path, key)} contains a lone surrogate") from None


def _label(path: _Where, key: bool) -> str:
    # A key is named by the object it belongs to: "events[0].payload.a key".
    return f"{_where(path)} key" if key else _where(path)


def check_json(value: object, what: str) -> JsonValue:
    """A JSON value, as a fresh copy with tuples turned into lists."""
    return _check_json(value, what)


def check_metadata(value: object, what: str) -> JsonObject:
    if not isinstance(value, Mapping):
        raise InvalidEventError(f"{what} must be a JSON object, not {type(value).__name__}")
    checked = _check_json(value, what)
    assert isinstance(checked, dict)
    return checked


def check_events(events: object, *, allow_empty: bool = False) -> tuple[NewEvent, ...]:
    """A non-empty sequence of valid :class:`NewEvent` (fresh, validated copies)."""
    if isinstance(events, NewEvent) or not isinstance(events, Sequence | Iterable):
        raise InvalidEventError(
            f"events must be a sequence of NewEvent, not {type(events).__name__}"
        )
    items = tuple(events)
    if not items and not allow_empty:
        raise InvalidEventError("events must not be empty")
    if len(items) > MAX_EVENTS_PER_APPEND:
        raise InvalidEventError(
            f"{len(items)} events in one append; the limit is {MAX_EVENTS_PER_APPEND}"
        )
    out = []
    for i, event in enumerate(items):
        if not isinstance(event, NewEvent):
            raise InvalidEventError(f"events[{i}] is a {type(event).__name__}, not a NewEvent")
        kind = event.kind
        if not isinstance(kind, str) or not kind:
            raise InvalidEventError(f"events[{i}].kind must be a non-empty str, got {kind!r}")
        if len(kind) > MAX_KIND_LENGTH or _CONTROL.search(kind):
            raise InvalidEventError(
                f"events[{i}].kind {kind[:40]!r} must be at most {MAX_KIND_LENGTH} printable "
                "characters"
            )
        _check_text(kind, f"events[{i}].kind")
        payload = check_json(event.payload, f"events[{i}].payload")
        metadata = check_metadata(event.metadata, f"events[{i}].metadata")
        reserved = RESERVED_METADATA_KEYS & metadata.keys()
        if reserved:
            raise InvalidEventError(
                f"events[{i}].metadata uses the reserved key(s) {sorted(reserved)}; "
                "the store stamps 'fence' from append(fence=...)"
            )
        out.append(NewEvent(str(kind), payload, metadata))
    return tuple(out)


# One encoder for every call: json.dumps with options builds a new one each time.
_CANONICAL: Final = json.JSONEncoder(
    separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
)


def canonical_json(value: JsonValue) -> str:
    """Compact JSON text with sorted keys (what SQL stores persist)."""
    return _CANONICAL.encode(value)


def check_append_requests(
    requests: Sequence[AppendRequest],
) -> list[tuple[AppendRequest, tuple[NewEvent, ...]]]:
    """A valid ``append_many`` batch: non-empty, each id once, each request checked."""
    if isinstance(requests, AppendRequest) or not isinstance(requests, Sequence):
        raise InvalidInputError("append_many takes a sequence of AppendRequest")
    if not requests:
        raise InvalidInputError("append_many needs at least one AppendRequest")
    seen: set[str] = set()
    out = []
    for i, request in enumerate(requests):
        if not isinstance(request, AppendRequest):
            raise InvalidInputError(f"requests[{i}] is a {type(request).__name__}, "
                                    "not an AppendRequest")
        execution_id = check_execution_id(request.execution_id)
        if execution_id in seen:
            raise InvalidInputError(
                f"append_many names {execution_id!r} twice; put its events in one request"
            )
        seen.add(execution_id)
        events = check_events(request.events)
        expected = check_sequence(request.expected_sequence, f"requests[{i}].expected_sequence")
        fence = None if request.fence is None else check_fence(request.fence)
        out.append((AppendRequest(execution_id, events, expected, fence), events))
    return out


def check_timer_record(record: object) -> TimerRecord:
    """A valid :class:`TimerRecord` with ``wake_at`` in UTC."""
    if not isinstance(record, TimerRecord):
        raise InvalidOptionError(f"schedule takes a TimerRecord, not {type(record).__name__}")
    execution_id = check_execution_id(record.execution_id)
    wake_at = check_aware(record.wake_at, "wake_at")
    redrive = record.redrive
    if redrive is not None:
        if not isinstance(redrive, Redrive):
            raise InvalidOptionError(f"redrive must be a Redrive, not {type(redrive).__name__}")
        attempt = redrive.attempt
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise InvalidOptionError(f"redrive.attempt must be an int >= 0, got {attempt!r}")
    return TimerRecord(execution_id, wake_at, redrive)


MAX_TTL_SECONDS: Final = 366 * 24 * 3600.0


def check_ttl(ttl_seconds: object) -> float:
    """A positive number of seconds, at most a year (a lease is a heartbeat, not a
    reservation; a larger value is almost certainly a unit mistake)."""
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise InvalidOptionError(
            f"ttl_seconds must be a number, not {type(ttl_seconds).__name__}"
        )
    if (isinstance(ttl_seconds, float) and not math.isfinite(ttl_seconds)) or ttl_seconds <= 0:
        raise InvalidOptionError(f"ttl_seconds must be finite and > 0, got {ttl_seconds!r}")
    if ttl_seconds > MAX_TTL_SECONDS:
        raise InvalidOptionError(
            f"ttl_seconds {ttl_seconds!r} is more than a year ({MAX_TTL_SECONDS:.0f} s); "
            "leases are renewed, not held for ages: check the unit"
        )
    return float(ttl_seconds)
