"""Bad input is refused with a typed error that says what was wrong, and writes nothing."""

from __future__ import annotations

import json
import math
from datetime import datetime

import pytest

from loom_core import (
    InvalidEventError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    InvalidSequenceError,
    NewEvent,
    Redrive,
    TimerRecord,
)
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore


@pytest.mark.parametrize(
    ("execution_id", "fragment"),
    [
        ("", "empty"),
        ("a\x00b", "control character"),
        ("line\nbreak", "control character"),
        (42, "must be a str"),
        (None, "must be a str"),
        ("x" * 600, "limit is 512"),
        ("\ud800", "lone surrogate"),
    ],
)
async def test_bad_execution_ids_are_refused(execution_id: object, fragment: str) -> None:
    store = MemoryEventStore()
    with pytest.raises(InvalidExecutionIdError, match=fragment):
        await store.append(execution_id, [NewEvent("k")], expected_sequence=0)  # type: ignore[arg-type]
    assert await store.list_executions() == ()


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        (NewEvent("k", {1: "x"}), "non-string key"),  # type: ignore[dict-item]
        (NewEvent("k", {"when": datetime.now()}), "not a JSON value"),  # type: ignore[dict-item]
        (NewEvent("k", math.nan), "JSON cannot represent"),
        (NewEvent("k", {"s": {1, 2}}), "not a JSON value"),  # type: ignore[dict-item]
        (NewEvent("k", "nul\x00inside"), "U\\+0000"),
        (NewEvent(""), "non-empty"),
        (NewEvent("k" * 300), "at most 200"),
        (NewEvent("k", None, {"fence": 9}), "reserved"),
        (NewEvent("k", None, ["not", "an", "object"]), "JSON object"),  # type: ignore[arg-type]
    ],
)
async def test_events_that_are_not_json_are_refused_and_nothing_is_written(
    event: NewEvent, fragment: str
) -> None:
    store = MemoryEventStore()
    good = NewEvent("ok", {"n": 1})
    with pytest.raises(InvalidEventError, match=fragment):
        await store.append("e", [good, event], expected_sequence=0)
    assert await store.head("e") == 0
    assert await store.read("e") == ()


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"a": [1, {"b": math.inf}]}, "events[1].payload.a[1].b is inf"),
        ([[{"x\x00": 1}]], "events[1].payload[0][0] key contains U+0000"),
        ({"deep": ("t", "\ud800")}, "events[1].payload.deep[1] contains a lone surrogate"),
    ],
)
async def test_a_refusal_names_where_in_the_payload_the_bad_value_is(
    payload: object, where: str
) -> None:
    store = MemoryEventStore()
    with pytest.raises(InvalidEventError) as caught:
        await store.append(
            "e", [NewEvent("ok"), NewEvent("k", payload)], expected_sequence=0  # type: ignore[arg-type]
        )
    assert str(caught.value).startswith(where)
    assert await store.head("e") == 0


async def test_events_must_be_a_non_empty_sequence_of_new_events() -> None:
    store = MemoryEventStore()
    with pytest.raises(InvalidEventError, match="must not be empty"):
        await store.append("e", [], expected_sequence=0)
    with pytest.raises(InvalidEventError, match="sequence of NewEvent"):
        await store.append("e", NewEvent("k"), expected_sequence=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidEventError, match="not a NewEvent"):
        await store.append("e", [{"kind": "k"}], expected_sequence=0)  # type: ignore[list-item]


@pytest.mark.parametrize("value", [-1, True, 1.0, "0", None])
async def test_sequences_must_be_non_negative_ints(value: object) -> None:
    store = MemoryEventStore()
    with pytest.raises(InvalidSequenceError):
        await store.append("e", [NewEvent("k")], expected_sequence=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidSequenceError):
        await store.read("e", from_sequence=value)  # type: ignore[arg-type]
    assert await store.head("e") == 0


@pytest.mark.parametrize("fence", [-1, True, "1", 1.5])
async def test_fences_must_be_non_negative_ints(fence: object) -> None:
    store = MemoryEventStore()
    with pytest.raises(InvalidSequenceError):
        await store.append("e", [NewEvent("k")], expected_sequence=0, fence=fence)  # type: ignore[arg-type]
    with pytest.raises(InvalidSequenceError):
        await store.acquire_fence_if("e", fence=fence, park_seq=0)  # type: ignore[arg-type]
    assert await store.acquire_fence("e") == 1  # nothing was bumped by the refusals


@pytest.mark.parametrize("limit", [0, -5, True, "10", 2.5])
async def test_limits_must_be_positive_ints(limit: object) -> None:
    store = MemoryEventStore()
    with pytest.raises(InvalidOptionError):
        await store.list_executions(limit=limit)  # type: ignore[arg-type]


def test_offer_must_name_optional_methods() -> None:
    with pytest.raises(InvalidOptionError, match="unknown optional methods"):
        MemoryEventStore(offer=["teleport"])  # type: ignore[list-item]
    with pytest.raises(InvalidOptionError, match="not a str"):
        MemoryEventStore(offer="subscribe")  # type: ignore[arg-type]


async def test_timers_refuse_naive_times_and_bad_records() -> None:
    timers = MemoryTimerStore()
    with pytest.raises(InvalidOptionError, match="timezone-aware"):
        await timers.schedule(TimerRecord("e", datetime(2026, 1, 1)))
    with pytest.raises(InvalidOptionError, match="TimerRecord"):
        await timers.schedule(("e", "2026"))  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="attempt"):
        await timers.schedule(TimerRecord("e", datetime.now().astimezone(), Redrive(-1)))
    with pytest.raises(InvalidOptionError, match="bool"):
        await timers.due(datetime.now().astimezone(), redrive="no")  # type: ignore[arg-type]
    assert await timers.pending("e") == ()


BAD_TTLS = [0, -1, math.inf, "5", True, 1e300, 10**400]


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=lambda v: repr(v)[:12])
async def test_leases_refuse_bad_ttls(ttl: object) -> None:
    leases = MemoryLeaseStore()
    with pytest.raises(InvalidOptionError):
        await leases.acquire("k", "me", ttl_seconds=ttl)  # type: ignore[arg-type]
    assert await leases.inspect("k") is None


async def test_a_bad_key_that_is_not_an_execution_id_is_named_as_what_it_is() -> None:
    leases = MemoryLeaseStore()
    with pytest.raises(InvalidExecutionIdError) as refused:
        await leases.acquire("k", "", ttl_seconds=5)
    assert str(refused.value).startswith("invalid lease holder ''")
    assert refused.value.what == "lease holder"
    assert await leases.inspect("k") is None


async def test_append_many_refuses_a_repeated_execution_and_writes_nothing() -> None:
    from loom_core import AppendRequest

    store = MemoryEventStore()
    with pytest.raises(InvalidInputError, match="twice"):
        await store.append_many(
            [AppendRequest("a", [NewEvent("k")], 0), AppendRequest("a", [NewEvent("k")], 1)]
        )
    assert await store.list_executions() == ()


@pytest.mark.parametrize(
    "value",
    [
        None, True, 0, -(2**63), 2**70, 1.5, -0.0, 5e-324, "", "é\u2028\x1f\"\\/🙂", [], {},
        {"b": 1, "a": {"d": [1, 2, {"z": None, "y": "x"}], "c": ""}, "É": [[[]]]},
    ],
)
def test_canonical_json_is_compact_sorted_json_text(value: object) -> None:
    from loom_core.spi import canonical_json

    assert canonical_json(value) == json.dumps(  # type: ignore[arg-type]
        value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
    )


def test_canonical_json_refuses_what_json_refuses() -> None:
    from loom_core.spi import canonical_json

    with pytest.raises(ValueError, match="Out of range float"):
        canonical_json({"a": [math.inf]})
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        canonical_json({"a": {1}})  # type: ignore[dict-item]
