"""``build_event`` and ``build_new_event`` build the very events ``Event(...)`` and
``NewEvent(...)`` build, and they stay frozen."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from datetime import UTC, datetime

import pytest

from loom_core import Event, JsonObject, JsonValue, NewEvent
from loom_core.spi import build_event, build_new_event, check_events

AT = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
PAYLOAD: JsonValue = {"result": [1, "two", None]}
METADATA: JsonObject = {"fence": 3}
FIELDS: tuple[str, int, str, JsonValue, JsonObject, datetime] = (
    "run-1", 7, "STEP_COMPLETED", PAYLOAD, METADATA, AT,
)


def test_it_is_the_event_the_constructor_builds() -> None:
    built, made = build_event(*FIELDS), Event(*FIELDS)
    assert type(built) is Event
    assert built == made
    assert repr(built) == repr(made)
    assert [getattr(built, f.name) for f in dataclasses.fields(Event)] == list(FIELDS)
    assert built.fence == 3
    # Nothing is copied: the values are the ones handed in, as with Event(...).
    assert built.payload is FIELDS[3]
    assert built.metadata is FIELDS[4]


def test_it_is_frozen() -> None:
    built = build_event(*FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.sequence = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del built.kind
    assert built.sequence == 7


def test_it_copies_pickles_and_replaces_like_any_event() -> None:
    built = build_event(*FIELDS)
    assert copy.deepcopy(built) == Event(*FIELDS)
    assert pickle.loads(pickle.dumps(built)) == Event(*FIELDS)
    assert dataclasses.replace(built, sequence=8) == Event(
        "run-1", 8, "STEP_COMPLETED", PAYLOAD, METADATA, AT
    )


def test_build_new_event_is_the_new_event_the_constructor_builds() -> None:
    metadata: JsonObject = {"trace": "t-1"}
    built = build_new_event("STEP_COMPLETED", PAYLOAD, metadata)
    made = NewEvent("STEP_COMPLETED", PAYLOAD, metadata)
    assert type(built) is NewEvent
    assert built == made
    assert repr(built) == repr(made)
    assert built.payload is PAYLOAD
    assert built.metadata is metadata
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.kind = "OTHER"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(built)) == made
    # A store takes it as it takes any NewEvent.
    assert check_events([built]) == (made,)
