"""The C fast path refuses exactly what the Python walk refuses, with the walk's message,
and accepts what it accepts (the walk being what every store checked before).

Each bad value is tried as a payload and inside metadata, through ``check_events`` and a
memory store; the expected error is the walk's own (``_check_json`` run on the value), so
a fast path that let a value through, or refused it in other words, fails here.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import math
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Final

import orjson
import pytest

from loom_core import EventKind, InvalidEventError, NewEvent
from loom_core.memory import MemoryEventStore
from loom_core.spi import check_batch, check_events, check_events_with_text
from loom_core.validation import MAX_INT_BITS, _check_json, _fast_json


class Color(enum.Enum):
    RED = 1


class Liar(enum.Enum):
    """An enum that claims to equal anything: the round-trip comparison alone would take
    it for the integer orjson writes."""

    ONE = 1

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 1


class LyingUUID(uuid.UUID):
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 1


class Level(enum.IntEnum):
    LOW = 1


class Mood(enum.StrEnum):
    CALM = "calm"


class Text(str):
    pass


class Number(int):
    pass


class Real(float):
    pass


class Record(dict[str, Any]):
    pass


class Items(list[Any]):
    pass


class View(Mapping[str, object]):
    """A read-only mapping that is not a dict."""

    def __init__(self, **items: object) -> None:
        self._items = items

    def __getitem__(self, key: str) -> object:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@dataclasses.dataclass
class Point:
    x: int = 1


def nested(levels: int, inner: object = 0, *, as_dict: bool = False) -> object:
    """``levels`` containers, one inside the other, around ``inner``."""
    value = inner
    for _ in range(levels):
        value = {"a": value} if as_dict else [value]
    return value


def empty_innermost(levels: int) -> object:
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


BAD: Final[tuple[object, ...]] = (
    # the kit's BAD_PAYLOADS
    {1, 2},
    object(),
    float("nan"),
    float("inf"),
    b"raw bytes",
    {1: "non-string key"},
    "nul \x00 in text",
    {"nested": [{"deeper": float("-inf")}]},
    # what orjson writes natively but is not JSON
    Color.RED,
    Liar.ONE,
    LyingUUID(int=1),
    uuid.UUID(int=7),
    orjson.Fragment(b'{"x":1}'),
    datetime.datetime(2026, 1, 1),
    datetime.date(2026, 1, 1),
    Point(),
    [Real("nan")],
    # other non-JSON values
    decimal.Decimal("1.5"),
    1j,
    frozenset({1}),
    bytearray(b"x"),
    memoryview(b"x"),
    [1, ..., 3],
    # keys
    {True: 1},
    {None: 1},
    {1.5: 1},
    {("a",): 1},
    {Text("k"): 1},
    {"ok": {2: "nested non-string key"}},
    # text
    {"k\x00": 1},
    "lone \ud800 surrogate",
    {"\udfff": 1},
    [["deep \x00"]],
    # size
    1 << MAX_INT_BITS,
    -(1 << MAX_INT_BITS),
    {"n": [1 << (MAX_INT_BITS + 300)]},
    nested(201),
    nested(201, as_dict=True),
    nested(260),
    nested(1000),
)
"""Values every store refuses; the walk's error is the one expected."""

GOOD: Final[tuple[object, ...]] = (
    None,
    True,
    0,
    -17,
    2**63,
    2**64,
    -(2**63) - 1,
    (1 << MAX_INT_BITS) - 1,
    -0.0,
    1e308,
    5e-324,
    "ünïcödé ∑ \"quotes\" \\ backslash",
    "a literal \\u0000 is six characters, not a NUL",
    "\U0001f600",
    [],
    {},
    (1, (2, 3)),
    {"t": ("x", [1, ("y",)])},
    Level.LOW,
    Mood.CALM,
    Text("sub"),
    Number(5),
    Real(2.5),
    Record(a=1),
    Items([1, 2]),
    collections.OrderedDict(b=1, a=2),
    View(x=1, y=[1, 2]),
    nested(200),
    nested(200, as_dict=True),
    empty_innermost(201),
    ["[[[{{{" * 100],
    {"wide": [{"i": i} for i in range(300)]},
    [[[[[[[[[[i] for i in range(50)]]]]]]]]],
)
"""Values every store accepts (tuples read back as lists)."""


def _ids(values: tuple[object, ...]) -> list[str]:
    return [f"{i}-{type(v).__name__}" for i, v in enumerate(values)]


def _walk_refusal(value: object, where: str) -> InvalidEventError:
    with pytest.raises(InvalidEventError) as caught:
        _check_json(value, where)
    return caught.value


@pytest.mark.parametrize("value", BAD, ids=_ids(BAD))
async def test_a_bad_payload_is_refused_with_the_walks_error_and_nothing_is_written(
    value: object,
) -> None:
    expected = _walk_refusal(value, "events[1].payload")
    with pytest.raises(InvalidEventError) as caught:
        check_events([NewEvent("ok"), NewEvent("k", value)])  # type: ignore[arg-type]
    assert str(caught.value) == str(expected)

    store = MemoryEventStore()
    with pytest.raises(InvalidEventError) as caught:
        await store.append(
            "e", [NewEvent("ok"), NewEvent("k", value)], expected_sequence=0  # type: ignore[arg-type]
        )
    assert str(caught.value) == str(expected)
    assert await store.head("e") == 0
    assert await store.read("e") == ()


@pytest.mark.parametrize("value", BAD, ids=_ids(BAD))
async def test_a_bad_payload_appended_alone_is_refused_with_the_walks_error(
    value: object,
) -> None:
    """A one-event append takes the store's shortest path: it refuses the same way."""
    expected = _walk_refusal(value, "events[0].payload")
    store = MemoryEventStore()
    for events in ([NewEvent("k", value)], (NewEvent("k", value),)):  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError) as caught:
            await store.append("e", events, expected_sequence=0)
        assert str(caught.value) == str(expected)
    assert await store.head("e") == 0
    assert await store.read("e") == ()


@pytest.mark.parametrize("value", BAD, ids=_ids(BAD))
def test_a_bad_payload_checked_alone_is_refused_with_the_walks_error(value: object) -> None:
    """``check_events`` of one event (what a decorator checks on most appends) takes the
    one-event path: it refuses the same way, as a list or a tuple."""
    expected = _walk_refusal(value, "events[0].payload")
    for events in ([NewEvent("k", value)], (NewEvent("k", value),)):  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError) as caught:
            check_events(events)
        assert str(caught.value) == str(expected)


@pytest.mark.parametrize("value", BAD, ids=_ids(BAD))
def test_a_bad_payload_is_refused_alike_with_its_text(value: object) -> None:
    """``check_events_with_text`` refuses what ``check_events`` refuses, with its error."""
    for events in (
        [NewEvent("k", value)],  # type: ignore[arg-type]
        [NewEvent("ok"), NewEvent("k", value)],  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidEventError) as expected:
            check_events(events)
        with pytest.raises(InvalidEventError) as caught:
            check_events_with_text(events)
        assert str(caught.value) == str(expected.value)


@pytest.mark.parametrize("value", BAD, ids=_ids(BAD))
async def test_a_bad_metadata_value_is_refused_with_the_walks_error(value: object) -> None:
    expected = _walk_refusal({"m": value}, "events[0].metadata")
    store = MemoryEventStore()
    with pytest.raises(InvalidEventError) as caught:
        await store.append("e", [NewEvent("k", None, {"m": value})], expected_sequence=0)  # type: ignore[dict-item]
    assert str(caught.value) == str(expected)
    assert await store.head("e") == 0


@pytest.mark.parametrize("value", GOOD, ids=_ids(GOOD))
async def test_a_good_value_is_accepted_and_reads_back_as_the_walks_copy(value: object) -> None:
    expected = _check_json(value, "events[0].payload")
    (checked,) = check_events([NewEvent("k", value)])  # type: ignore[arg-type]
    assert checked.payload == expected
    # The one-event path gives what the batch path gives for the same event, to the type.
    batched = check_events([NewEvent("k", value), NewEvent("k", value)])[1]  # type: ignore[arg-type]
    assert batched == checked
    assert type(batched.payload) is type(checked.payload)
    # The text the check wrote reads back as the copy, alone, in a batch, or handed in
    # as a checked batch.
    alone = [NewEvent("k", value)]  # type: ignore[arg-type]
    pair = [NewEvent("ok", {"n": 1}), NewEvent("k", value)]  # type: ignore[arg-type]
    for events, at in ((alone, 0), (pair, 1), (check_batch(pair), 1)):
        copies, texts = check_events_with_text(events)
        assert copies == check_events(events)
        assert len(texts) == len(copies)
        assert json.loads(texts[at]) == expected
    # A list of events without metadata is checked without a batch built: the same
    # copies and the same text as through the batch, and the same batch as event by
    # event (an iterator takes that path).
    via_batch = check_batch(pair)
    assert check_events(pair) == tuple(via_batch)
    assert check_events_with_text(pair) == check_events_with_text(via_batch)
    assert via_batch._state[1:] == check_batch(iter(pair))._state[1:]

    store = MemoryEventStore()
    (written,) = await store.append("e", [NewEvent("k", value)], expected_sequence=0)  # type: ignore[arg-type]
    (read,) = await store.read("e")
    assert read == written
    assert read.payload == expected
    assert _same_types(read.payload, expected)


@pytest.mark.parametrize("value", GOOD, ids=_ids(GOOD))
async def test_a_metadata_value_gets_the_walks_verdict(value: object) -> None:
    """Inside metadata a value sits one level deeper, so the deepest good payloads are
    refused there: by the fast path exactly as by the walk."""
    store = MemoryEventStore()
    event = NewEvent("k", None, {"m": value})  # type: ignore[dict-item]
    refused: InvalidEventError | None = None
    try:
        expected = _check_json({"m": value}, "events[0].metadata")
    except InvalidEventError as walk_refused:
        refused = walk_refused
    if refused is not None:
        with pytest.raises(InvalidEventError, match=re.escape(str(refused))):
            await store.append("e", [event], expected_sequence=0)
        assert await store.head("e") == 0
        return
    (written,) = await store.append("e", [event], expected_sequence=0)
    assert written.metadata == expected
    assert (await store.read("e"))[0].metadata == expected


def _same_types(a: object, b: object) -> bool:
    """Exact JSON types on both sides (an int is never read back as a float, nor a tuple
    as anything but a list)."""
    if isinstance(b, bool | type(None)):
        return a is b
    if isinstance(b, dict):
        return type(a) is dict and all(_same_types(a[k], v) for k, v in b.items())
    if isinstance(b, list):
        return type(a) is list and all(_same_types(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(b, int):
        return type(a) is int
    if isinstance(b, float):
        return type(a) is float
    return isinstance(a, str)


@pytest.mark.parametrize(
    "value",
    [
        {"workflow": "bench", "input": {"n": 1}},
        {"step": "one", "result": {"ok": True, "items": [1, 2.5, "three", None]}},
        "text",
        [2**63 - 1, -(2**63)],
        nested(200),
        {"wide": [{"i": i} for i in range(300)]},
    ],
    ids=["start", "step", "text", "int64", "200-levels", "wide"],
)
def test_common_values_take_the_fast_path(value: object) -> None:
    assert _fast_json(value) is not None


@pytest.mark.parametrize(
    "value",
    [math.nan, Color.RED, Liar.ONE, (1, 2), 2**64, "\x00", nested(201), Text("x")],
    ids=["nan", "enum", "lying-enum", "tuple", "past-64-bits", "nul", "201-levels", "subclass"],
)
def test_what_the_fast_path_cannot_vouch_for_goes_to_the_walk(value: object) -> None:
    assert _fast_json(value) is None


def test_a_list_without_metadata_is_checked_as_event_by_event() -> None:
    """The path for a list of events without metadata gives what checking each event
    gives: kinds as plain text, the same encodings, the kernel kinds that answer a park
    flagged so, and fresh copies."""
    payload: dict[str, Any] = {"a": [1, 2], "b": None}
    events = [
        NewEvent(EventKind.EXECUTION_RESUMED, payload),
        NewEvent("order.placed", [1, "x"]),
        NewEvent("EXECUTION_COMPLETED", None),
    ]
    fast, slow = check_batch(events), check_batch(iter(events))
    assert fast._state[1:] == slow._state[1:]
    assert fast._state[4] == (True, False, True)
    assert all(type(kind) is str for kind in fast._state[1])
    copies = check_events(events)
    assert copies == check_events(iter(events))
    assert check_events_with_text(events) == check_events_with_text(iter(events))
    assert copies[0].payload == payload
    assert copies[0].payload is not payload

