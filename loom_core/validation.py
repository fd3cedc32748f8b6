"""Checks every public entry point runs on its arguments before touching a store.

Each check raises an :class:`~loom_core.errors.InvalidInputError` subclass that says what
was wrong, so a refused call never writes anything.
"""

from __future__ import annotations

import json
import marshal
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Final, cast

import orjson

from loom_core.checked import CheckedEvents, Encoded, _build, decode, sealed
from loom_core.errors import (
    InvalidEventError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    InvalidSequenceError,
)
from loom_core.events import JsonObject, JsonValue, NewEvent, build_new_event
from loom_core.kinds import ANSWERING_KINDS, EventKind, is_answering_kind
from loom_core.protocols import AppendRequest, Redrive, TimerRecord

__all__ = [
    "MAX_ID_BYTES",
    "MAX_INT_BITS",
    "MAX_POSITION",
    "MAX_KIND_LENGTH",
    "RESERVED_METADATA_KEYS",
    "canonical_json",
    "check_append",
    "check_batch",
    "check_append_requests",
    "check_aware",
    "check_count",
    "check_events",
    "check_events_with_text",
    "check_execution_id",
    "check_fence",
    "check_limit",
    "check_read",
    "check_sequence",
    "check_key",
    "check_timer_record",
    "check_ttl",
    "json_text",
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
    # The common case in two C calls: printable ASCII is one byte a character, and
    # isprintable() is False for every control character (tab, newline, NUL, DEL...).
    if (
        type(value) is str
        and 0 < len(value) <= MAX_ID_BYTES
        and value.isascii()
        and value.isprintable()
    ):
        return value
    if not isinstance(value, str):
        wrong_type = f"{what} must be a str, not {type(value).__name__}"
        raise InvalidExecutionIdError(value, wrong_type, what)
    fault = _key_fault(value, what)
    if fault is not None:
        raise InvalidExecutionIdError(value, fault, what)
    return value


def _key_fault(value: str, what: str) -> str | None:
    """Why ``value`` is not a key, or None when it is one (non-ASCII, a str subclass)."""
    if not value:
        return f"{what} must not be empty"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{what} contains a lone surrogate"
    if size > MAX_ID_BYTES:
        return f"{what} is {size} bytes; the limit is {MAX_ID_BYTES}"
    if _CONTROL.search(value):
        return f"{what} contains a control character (NUL included)"
    return None


def check_execution_id(value: object) -> str:
    if (
        type(value) is str
        and 0 < len(value) <= MAX_ID_BYTES
        and value.isascii()
        and value.isprintable()
    ):
        return value
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
    if type(value) is int and 0 <= value <= MAX_POSITION:
        return value
    return _check_int(value, what, 0)


def check_fence(value: object, what: str = "fence") -> int:
    if type(value) is int and 0 <= value <= MAX_POSITION:
        return value
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
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidOptionError(
            f"{what} {value.isoformat()} falls outside the years 1 to 9999 in UTC"
        ) from None


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


# -- the fast path ------------------------------------------------------------------------
#
# orjson writes a value in C and refuses most of what the rules refuse (non-string keys,
# lone surrogates, sets, bytes, datetimes, subclasses of the JSON types, more than 254
# levels). What it would let through is caught by cheap checks on its output, and
# anything they cannot vouch for goes to the pure-Python walk above, which decides and
# words the refusal exactly as it always has:
#
# - marshal refuses every object that is not of an exact built-in type, so no enum, UUID
#   or orjson.Fragment (which orjson writes) and no overridden ``__eq__`` gets through;
# - decoding the output again and comparing it with the value (exact built-in types
#   only, by then) catches NaN and infinities (written as null) and tuples (read back as
#   lists, which the walk accepts and converts);
# - an escaped U+0000 or more than 200 levels of nesting is looked for in the output.

_ORJSON_OPTIONS: Final = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
_MAX_DEPTH: Final = 200
_ESCAPED_NUL: Final = b"\\u0000"
_STRING: Final = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_INNERMOST: Final = re.compile(rb"\[\]|\{\}")
_NOT_BRACKET: Final = bytes(b for b in range(256) if b not in b"[]{}")


def _nests_deeper_than_limit(encoded: bytes) -> bool:
    """Whether the JSON text ``encoded`` may nest more than 200 containers (True when it
    is exactly at the edge: the walk decides those)."""
    if encoded.count(b"[") + encoded.count(b"{") <= _MAX_DEPTH:
        return False
    skeleton = _STRING.sub(b"", encoded).translate(None, _NOT_BRACKET)
    levels = 0
    while skeleton:
        # Each pass removes every container that holds no container: one level.
        skeleton = _INNERMOST.sub(b"", skeleton)
        levels += 1
        if levels > _MAX_DEPTH:
            return True
    return False


def _fast_json(value: object) -> tuple[bytes, JsonValue] | None:
    """``value`` as orjson bytes and a fresh decoded copy, when the fast checks prove it
    valid; None when only the walk can tell."""
    try:
        encoded = _dumps(value, option=_ORJSON_OPTIONS)
        _marshal(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    copy: JsonValue = _loads(encoded)
    # find() rather than ``in``: bytes' ``in`` takes its operand through the buffer
    # protocol, at twice the cost on this path.
    if copy != value or encoded.find(_ESCAPED_NUL) >= 0:
        return None
    if len(encoded) > 2 * _MAX_DEPTH and _nests_deeper_than_limit(encoded):
        return None
    return encoded, copy


_dumps: Final = orjson.dumps
_loads: Final = orjson.loads
_marshal: Final = marshal.dumps


def _encode_json(value: object, path: _Where) -> tuple[Encoded, JsonValue]:
    """A checked JSON value's encoded form and a fresh copy; refuses what the walk
    refuses, with its message."""
    fast = _fast_json(value)
    if fast is not None:
        return fast
    return _walk_json(value, path)


def _walk_json(value: object, path: _Where) -> tuple[Encoded, JsonValue]:
    """The rare path: what the fast checks could not vouch for, checked by the walk."""
    copy = _check_json(value, path)
    # The walk accepted what orjson would not write (an integer past 64 bits, a
    # subclass of a JSON type, a tuple): orjson may write its copy, else json text.
    retry = _fast_json(copy)
    if retry is not None:
        return retry
    return json_text(copy), copy


_EMPTY: Final = b"{}"


def _encode_metadata(value: object, path: _Where) -> tuple[Encoded, JsonObject]:
    if type(value) is dict:
        if not value:
            return _EMPTY, {}
    elif not isinstance(value, Mapping):
        raise InvalidEventError(
            f"{_where(path)} must be a JSON object, not {type(value).__name__}"
        )
    encoded, copy = _encode_json(value, path)
    assert isinstance(copy, dict)
    return encoded, copy


def check_metadata(value: object, what: str) -> JsonObject:
    return _encode_metadata(value, what)[1]


def _refuse_reserved(metadata: JsonObject, path: _Where) -> None:
    reserved = RESERVED_METADATA_KEYS & metadata.keys()
    if reserved:
        raise InvalidEventError(
            f"{_where(path)} uses the reserved key(s) {sorted(reserved)}; "
            "the store stamps 'fence' from append(fence=...)"
        )


def _check_kind(kind: object, i: int) -> str:
    if (
        type(kind) is str
        and 0 < len(kind) <= MAX_KIND_LENGTH
        and kind.isascii()
        and kind.isprintable()
    ):
        return kind
    if type(kind) is EventKind:
        return kind._value_  # a kernel kind: valid, and stored as its plain str
    if not isinstance(kind, str) or not kind:
        raise InvalidEventError(f"events[{i}].kind must be a non-empty str, got {kind!r}")
    if len(kind) > MAX_KIND_LENGTH or _CONTROL.search(kind):
        raise InvalidEventError(
            f"events[{i}].kind {kind[:40]!r} must be at most {MAX_KIND_LENGTH} printable "
            "characters"
        )
    _check_text(kind, f"events[{i}].kind")
    return str(kind)


def _check_items(events: object, allow_empty: bool) -> tuple[object, ...]:
    if type(events) is tuple:
        items: tuple[object, ...] = events
    elif type(events) is list:
        items = tuple(events)
    elif isinstance(events, NewEvent) or not isinstance(events, Sequence | Iterable):
        raise InvalidEventError(
            f"events must be a sequence of NewEvent, not {type(events).__name__}"
        )
    else:
        items = tuple(events)
    if not items and not allow_empty:
        raise InvalidEventError("events must not be empty")
    if len(items) > MAX_EVENTS_PER_APPEND:
        raise InvalidEventError(
            f"{len(items)} events in one append; the limit is {MAX_EVENTS_PER_APPEND}"
        )
    return items


Copies = list[tuple[JsonValue, JsonObject]]
"""Fresh copies of a checked batch's payloads and metadata, made by the check itself."""


CheckedEvent = tuple[str, Encoded, Encoded, bool, JsonValue, JsonObject]
"""One checked event: kind, encoded payload and metadata, whether it answers, and fresh
copies of the payload and metadata."""


def _check_event(event: object, i: int) -> CheckedEvent:
    """One event checked: kind, encoded payload and metadata, whether it answers, and
    fresh copies of the payload and metadata."""
    if not isinstance(event, NewEvent):
        raise InvalidEventError(f"events[{i}] is a {type(event).__name__}, not a NewEvent")
    kind = _check_kind(event.kind, i)
    payload = event.payload
    fast: tuple[Encoded, JsonValue] | None = _fast_json(payload)
    if fast is None:
        fast = _walk_json(payload, (("events", i), "payload"))
    metadata = event.metadata
    if type(metadata) is dict and not metadata:
        encoded_metadata: Encoded = _EMPTY
        metadata_copy: JsonObject = {}
    else:
        where: _Where = (("events", i), "metadata")
        encoded_metadata, metadata_copy = _encode_metadata(metadata, where)
        _refuse_reserved(metadata_copy, where)
    return (
        kind,
        fast[0],
        encoded_metadata,
        is_answering_kind(kind, metadata_copy),
        fast[1],
        metadata_copy,
    )


def _check_batch(
    events: object, allow_empty: bool = False
) -> tuple[CheckedEvents, Copies | None]:
    """The checked batch, and fresh copies of each event's payload and metadata when the
    check made them (None when ``events`` was already a checked batch)."""
    kind_of = type(events)
    if kind_of is CheckedEvents:
        batch = sealed(events)
        if batch is None:
            raise InvalidEventError(
                "events is a CheckedEvents the kernel did not build (only check_batch "
                "makes one); pass the events themselves"
            )
        if not batch._state[1] and not allow_empty:
            raise InvalidEventError("events must not be empty")
        return batch, None
    elif (kind_of is tuple or kind_of is list) and len(events) == 1:  # type: ignore[arg-type]
        # The most common append, one event, without building columns.
        kind, payload, metadata, answers, payload_copy, metadata_copy = _check_event(
            events[0], 0  # type: ignore[index]
        )
        return (
            _build((kind,), (payload,), (metadata,), (answers,)),
            [(payload_copy, metadata_copy)],
        )
    plain = _check_plain_batch(events)
    if plain is not None:
        # Events without metadata: only a kernel kind can answer.
        plain_kinds, plain_payloads, plain_copies = plain
        return (
            _build(
                tuple(plain_kinds),
                tuple(plain_payloads),
                (_EMPTY,) * len(plain_kinds),
                tuple([kind in ANSWERING_KINDS for kind in plain_kinds]),
            ),
            [(copy, {}) for copy in plain_copies],
        )
    items = _check_items(events, allow_empty)
    if not items:
        return _build((), (), (), ()), []
    rows = [_check_event(event, i) for i, event in enumerate(items)]
    kinds, payloads, metadatas, answering, payload_copies, metadata_copies = zip(
        *rows, strict=True
    )
    return (
        _build(kinds, payloads, metadatas, answering),
        list(zip(payload_copies, metadata_copies, strict=True)),
    )


def _check_plain(event: object) -> tuple[str, bytes, JsonValue] | None:
    """The common event, checked as :func:`_check_event` would by the same fast checks:
    a NewEvent with a printable ASCII kind, no metadata and a payload the fast checks
    vouch for; its kind, encoded payload and a fresh copy of it. None for anything else,
    valid or not, which is :func:`_check_event`'s to decide and word."""
    if type(event) is not NewEvent:
        return None
    kind = event.kind
    if type(kind) is EventKind:
        kind = kind._value_
    payload = event.payload
    metadata = event.metadata
    if (
        type(metadata) is dict
        and not metadata
        and type(kind) is str
        and 0 < len(kind) <= MAX_KIND_LENGTH
        and kind.isascii()
        and kind.isprintable()
    ):
        try:
            encoded = _dumps(payload, None, _ORJSON_OPTIONS)
            _marshal(payload)
        except (TypeError, ValueError):
            return None
        copy: JsonValue = _loads(encoded)
        if (
            copy == payload
            and encoded.find(_ESCAPED_NUL) < 0
            and (len(encoded) <= 2 * _MAX_DEPTH or not _nests_deeper_than_limit(encoded))
        ):
            return kind, encoded, copy
    return None


def _check_single(events: object) -> CheckedEvent | None:
    """The one event of a one-event list or tuple, checked (what most appends carry, with
    no batch built); None for anything else, which :func:`_check_batch` takes."""
    kind_of = type(events)
    if (kind_of is not tuple and kind_of is not list) or len(events) != 1:  # type: ignore[arg-type]
        return None
    event = events[0]  # type: ignore[index]
    plain = _check_plain(event)
    if plain is None:
        return _check_event(event, 0)
    kind, encoded, copy = plain
    # With no metadata, only a kernel kind can answer.
    return kind, encoded, _EMPTY, kind in ANSWERING_KINDS, copy, {}


def _check_plain_batch(
    events: object,
) -> tuple[list[str], list[bytes], list[JsonValue]] | None:
    """A list or tuple of common events (see :func:`_check_plain`), checked with no batch
    built: each one's kind, encoded payload and fresh copy of it. None if any is not one
    (or the count is out of bounds), for :func:`_check_batch` to decide and word."""
    kind_of = type(events)
    if (kind_of is not tuple and kind_of is not list) or not (
        0 < len(events) <= MAX_EVENTS_PER_APPEND  # type: ignore[arg-type]
    ):
        return None
    kinds: list[str] = []
    encoded: list[bytes] = []
    copies: list[JsonValue] = []
    for event in events:  # type: ignore[attr-defined]
        plain = _check_plain(event)
        if plain is None:
            return None
        kinds.append(plain[0])
        encoded.append(plain[1])
        copies.append(plain[2])
    return kinds, encoded, copies


def _new_events(batch: CheckedEvents, copies: Copies | None) -> tuple[NewEvent, ...]:
    if copies is None:
        return tuple(batch)
    kinds = batch._state[1]
    if len(kinds) == 1:
        payload, metadata = copies[0]
        return (build_new_event(kinds[0], payload, metadata),)
    return tuple(
        build_new_event(kind, payload, metadata)
        for kind, (payload, metadata) in zip(kinds, copies, strict=True)
    )


def check_batch(events: object, *, allow_empty: bool = False) -> CheckedEvents:
    """A non-empty sequence of valid :class:`NewEvent`, as a :class:`CheckedEvents`.

    A :class:`CheckedEvents` the kernel built is returned as it is, unchecked again (in
    O(1)): a decorator passes the batch it checked to the store below, and the store's
    own ``check_batch`` costs nothing. Anything else is checked event by event and
    refused, before anything is written, with the :class:`InvalidEventError` that says
    what was wrong and where.
    """
    return _check_batch(events, allow_empty)[0]


def check_events(events: object, *, allow_empty: bool = False) -> tuple[NewEvent, ...]:
    """A non-empty sequence of valid :class:`NewEvent` (fresh, validated copies).

    A :class:`CheckedEvents` is not checked again (its items are fresh copies already);
    :func:`check_batch` returns the checked batch itself, to pass to the store below.
    """
    single = _check_single(events)
    if single is not None:
        # One event, the usual append: its copies, with no batch built only to be
        # taken apart again.
        return (build_new_event(single[0], single[4], single[5]),)
    plain = _check_plain_batch(events)
    if plain is not None:
        return tuple([
            build_new_event(kind, copy, {}) for kind, copy in zip(plain[0], plain[2], strict=True)
        ])
    return _new_events(*_check_batch(events, allow_empty))


def check_events_with_text(events: object) -> tuple[tuple[NewEvent, ...], tuple[str, ...]]:
    """:func:`check_events` (never empty), and each payload's JSON text as the check wrote
    it: compact, its keys in the order given, its value exactly the copy's. For a store
    that keeps payloads as JSON text, so it need not encode them a second time.
    """
    single = _check_single(events)
    if single is not None:
        return (build_new_event(single[0], single[4], single[5]),), (_as_text(single[1]),)
    plain = _check_plain_batch(events)
    if plain is not None:
        plain_kinds, plain_payloads, plain_copies = plain
        return (
            tuple([
                build_new_event(kind, copy, {})
                for kind, copy in zip(plain_kinds, plain_copies, strict=True)
            ]),
            tuple([text.decode() for text in plain_payloads]),
        )
    batch, copies = _check_batch(events)
    return _new_events(batch, copies), tuple([_as_text(p) for p in batch._state[2]])


def _as_text(encoded: Encoded) -> str:
    if isinstance(encoded, bytes):
        return encoded.decode("utf-8")
    return encoded


def rebuild_payloads(batch: CheckedEvents, payloads: Sequence[object]) -> CheckedEvents:
    """``batch`` with each payload replaced (see :meth:`CheckedEvents.with_payloads`)."""
    if sealed(batch) is None:
        batch = check_batch(batch, allow_empty=True)
    values = _check_replacements(batch, payloads, "payloads")
    encoded: list[Encoded] = []
    for i, value in enumerate(values):
        fast = _fast_json(value)
        encoded.append(
            fast[0] if fast is not None else _walk_json(value, (("events", i), "payload"))[0]
        )
    _, kinds, _, metadata, answering = batch._state
    return _build(kinds, tuple(encoded), metadata, answering)


def rebuild_metadata(batch: CheckedEvents, extra: Sequence[JsonObject]) -> CheckedEvents:
    """``batch`` with ``extra[i]`` merged into each event's metadata (see
    :meth:`CheckedEvents.with_metadata`).

    Only ``extra`` is checked and encoded. Its encoded pairs are spliced into the event's
    encoded metadata, which is neither decoded nor checked again: the result is the bytes
    orjson writes for the merged object (the event's keys in their order, then the new
    ones). Only where a key of ``extra`` may be there already (its encoded form followed
    by ``:`` occurs in the bytes) is the metadata decoded, and only where it is there
    (``extra``'s value wins, in the key's old place) merged and encoded again."""
    if sealed(batch) is None:
        batch = check_batch(batch, allow_empty=True)
    values = _check_replacements(batch, extra, "extra")
    _, kinds, payloads, metadata, answering = batch._state
    encoded: list[Encoded] = []
    answers: list[bool] = []
    last: object = _UNSET
    added_encoded: Encoded = _EMPTY
    added: JsonObject = {}
    needles: list[bytes] = []
    kernel = False
    for i, add in enumerate(values):
        if add is not last:
            # The same object for every event (a stamp) is checked once.
            fast = _fast_json(add) if type(add) is dict and add else None
            if fast is not None:
                added_encoded, added = fast  # type: ignore[assignment]
            else:
                what: _Where = (("events", i), "metadata")
                added_encoded, added = _encode_metadata(add, what)
            if not RESERVED_METADATA_KEYS.isdisjoint(added):
                _refuse_reserved(added, (("events", i), "metadata"))
            last = add
            kernel = "kernel" in added
            # How each new key reads in the encoded bytes (none for json text, which
            # is never spliced).
            needles = []
            if type(added_encoded) is bytes:
                for key in added:
                    needles.append(_dumps(key) + b":")
        current = metadata[i]
        if not added:
            encoded.append(current)
        elif current == _EMPTY:
            encoded.append(added_encoded)
        elif (
            needles
            and type(current) is bytes
            and not (
                needles[0] in current if len(needles) == 1 else _any_in(needles, current)
            )
        ):
            # The pairs of both objects, one after the other: what orjson writes for
            # the merged object.
            encoded.append(current[:-1] + b"," + added_encoded[1:])  # type: ignore[operator]
        else:
            encoded.append(_merge_decoded(current, added_encoded, added))
        answers.append(is_answering_kind(kinds[i], added) if kernel else answering[i])
    return _build(kinds, payloads, tuple(encoded), tuple(answers))


def _any_in(needles: list[bytes], encoded: bytes) -> bool:
    return any(needle in encoded for needle in needles)


_UNSET: Final = object()


def _merge_decoded(current: Encoded, added_encoded: Encoded, added: JsonObject) -> Encoded:
    """The encoded metadata ``current`` with the checked object ``added`` merged in (its
    keys win), where a key of ``added`` may already be in ``current``."""
    merged = decode(current)
    assert isinstance(merged, dict)
    if (
        type(current) is bytes
        and type(added_encoded) is bytes
        and merged.keys().isdisjoint(added)
    ):
        # The key was found nested deeper, or inside a string: the splice is right.
        return current[:-1] + b"," + added_encoded[1:]
    merged.update(added)
    # Both halves are checked, and merging nests nothing deeper than either.
    return _encode_metadata(merged, "metadata")[0]


def _check_replacements(
    batch: CheckedEvents, values: Sequence[object], what: str
) -> tuple[object, ...]:
    kind_of = type(values)
    if (kind_of is list or kind_of is tuple) and len(values) == len(batch._state[1]):
        return tuple(values)
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Sequence):
        raise InvalidEventError(f"{what} must be a sequence, one per event")
    items = tuple(values)
    if len(items) != len(batch):
        raise InvalidEventError(
            f"{len(items)} {what} for a batch of {len(batch)} events; give one per event"
        )
    return items


def _json_writer(*, sort_keys: bool) -> Callable[[JsonValue], str]:
    """Compact JSON text, keys sorted or in the order given, with one encoder for every
    call: ``json.dumps`` with options builds a new one each time.

    And one C encoder under it where there is one: ``JSONEncoder.encode`` builds a new
    one, and the Python frames around it, on every call, which cost more than the
    encoding of a small value. Without the circular-reference markers: a checked value has
    no cycle (nor more than 200 levels)."""
    encoder = json.JSONEncoder(
        separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False, allow_nan=False
    )
    if c_make_encoder is None:
        return encoder.encode
    chunks = c_make_encoder(
        None, encoder.default, encode_basestring, None, ":", ",", sort_keys, False, False
    )

    def write(value: JsonValue) -> str:
        return "".join(chunks(value, 0))

    return write


_CANONICAL: Final = _json_writer(sort_keys=True)

# What the check writes where orjson cannot (an integer beyond 64 bits): compact, as
# orjson writes, and with the keys in the order given, as orjson keeps them. Sorted, an
# object's keys would read back in another order than the writer's, depending only on
# whether some number in it is large: a workflow replayed from it would iterate them
# otherwise than it did live.
_ORDERED: Final = _json_writer(sort_keys=False)


def canonical_json(value: JsonValue) -> str:
    """Compact JSON text with sorted keys: one text for equal values, for what is hashed
    or signed. Not for a payload or metadata a store keeps (:func:`json_text`)."""
    return _CANONICAL(value)


def json_text(value: JsonValue) -> str:
    """Compact JSON text with the keys in the order given: what the check writes for a
    payload (the text ``check_events_with_text`` hands over). For a store that encodes a
    checked payload itself, so that it reads back as it was written."""
    return _ORDERED(value)


def check_append_requests(
    requests: Sequence[AppendRequest],
) -> list[tuple[AppendRequest, tuple[NewEvent, ...]]]:
    """A valid ``append_many`` batch: non-empty, each id once, each request checked.

    Each request comes back with its events as a :class:`CheckedEvents` (so a decorator
    that forwards the request costs the store below no second check), beside a tuple of
    fresh copies of them."""
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
        batch, copies = _check_batch(request.events)
        expected = check_sequence(request.expected_sequence, f"requests[{i}].expected_sequence")
        fence = None if request.fence is None else check_fence(request.fence)
        events = _new_events(batch, copies)
        out.append((AppendRequest(execution_id, batch, expected, fence), events))
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
