"""A CheckedEvents is checked once, cannot be forged or changed, and a store below a
decorator that passes it on does not check it again."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Sequence
from typing import Any

import pytest

import loom_core.validation as validation
from loom_core import Event, InvalidEventError, NewEvent
from loom_core.checked import _SEAL, CheckedEvents
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator
from loom_core.memory import MemoryEventStore
from loom_core.spi import AppendRequest, check_append_requests, check_batch, check_events

EVENTS = [NewEvent("order.placed", {"items": [1, 2]}, {"trace": "t1"}), NewEvent("k")]


def test_check_batch_returns_a_checked_batch_of_the_events() -> None:
    batch = check_batch(EVENTS)
    assert isinstance(batch, CheckedEvents)
    assert isinstance(batch, Sequence)
    assert len(batch) == 2
    assert list(batch) == EVENTS
    assert batch[0] == EVENTS[0]
    assert batch[-1] == EVENTS[1]
    assert batch[:1] == (EVENTS[0],)
    assert batch.kinds() == ("order.placed", "k")
    assert batch.payloads() == ({"items": [1, 2]}, None)
    assert batch.metadata() == ({"trace": "t1"}, {})


def test_a_checked_batch_is_taken_back_as_it_is() -> None:
    batch = check_batch(EVENTS)
    assert check_batch(batch) is batch
    assert check_events(batch) == tuple(EVENTS)
    ((request, events),) = check_append_requests([AppendRequest("e", batch, 0)])
    assert request.events is batch
    assert events == tuple(EVENTS)


def test_an_empty_checked_batch_is_refused_where_events_must_not_be_empty() -> None:
    empty = check_batch([], allow_empty=True)
    assert len(empty) == 0
    with pytest.raises(InvalidEventError, match="must not be empty"):
        check_batch(empty)


def test_it_cannot_be_built_from_outside_the_kernel() -> None:
    with pytest.raises(TypeError, match="check_batch"):
        CheckedEvents(EVENTS)


@pytest.mark.parametrize("state", [None, (object(), ("k",), (b"null",), (b"{}",), (False,))],
                         ids=["no-state", "wrong-seal"])
def test_a_forged_batch_is_refused_by_every_check(state: object) -> None:
    forged: Any = object.__new__(CheckedEvents)
    if state is not None:
        object.__setattr__(forged, "_state", state)
    for check in (check_batch, check_events):
        with pytest.raises(InvalidEventError, match="did not build"):
            check(forged)
    with pytest.raises(InvalidEventError, match="did not build"):
        check_append_requests([AppendRequest("e", forged, 0)])


async def test_a_store_refuses_a_forged_batch_and_writes_nothing() -> None:
    forged: Any = object.__new__(CheckedEvents)
    # What a check would have refused: the reserved fence key, dressed up as checked.
    object.__setattr__(forged, "_state", (object(), ("k",), (b"null",), (b'{"fence":9}',),
                                          (False,)))
    store = MemoryEventStore()
    with pytest.raises(InvalidEventError, match="did not build"):
        await store.append("e", forged, expected_sequence=0)
    assert await store.head("e") == 0


def test_it_cannot_be_changed_copied_or_pickled() -> None:
    batch = check_batch(EVENTS)
    with pytest.raises(AttributeError):
        batch._state = (_SEAL, (), (), (), ())
    with pytest.raises(AttributeError):
        del batch._state
    with pytest.raises(TypeError, match="not copied or pickled"):
        copy.copy(batch)
    with pytest.raises(TypeError, match="not copied or pickled"):
        copy.deepcopy(batch)
    with pytest.raises(TypeError, match="not copied or pickled"):
        pickle.dumps(batch)


def test_changing_an_item_or_the_input_never_changes_the_batch() -> None:
    payload: dict[str, Any] = {"items": [1, 2]}
    batch = check_batch([NewEvent("k", payload, {"m": [1]})])
    payload["items"].append("after the check")
    item = batch[0]
    assert isinstance(item.payload, dict)
    item_payload: Any = item.payload
    item_payload["items"].append("changed copy")
    item_metadata: Any = item.metadata
    item_metadata["m"].append(2)
    assert batch[0] == NewEvent("k", {"items": [1, 2]}, {"m": [1]})
    assert batch.payloads()[0] is not batch.payloads()[0]


def test_with_payloads_checks_only_the_new_payloads_and_keeps_the_rest() -> None:
    batch = check_batch(EVENTS)
    sealed = batch.with_payloads([{"sealed": "abc"}, ("t",)])
    assert list(sealed) == [
        NewEvent("order.placed", {"sealed": "abc"}, {"trace": "t1"}),
        NewEvent("k", ["t"], {}),
    ]
    assert list(batch) == EVENTS
    assert check_batch(sealed) is sealed
    with pytest.raises(InvalidEventError, match=r"events\[1\]\.payload is nan"):
        batch.with_payloads([None, float("nan")])
    with pytest.raises(InvalidEventError, match="one per event"):
        batch.with_payloads([None])


def test_with_metadata_merges_checked_keys_and_refuses_the_reserved_one() -> None:
    batch = check_batch(EVENTS)
    linked = batch.with_metadata([{"chain": "h0"}, {"chain": "h1", "kernel": True}])
    assert [e.metadata for e in linked] == [
        {"trace": "t1", "chain": "h0"},
        {"chain": "h1", "kernel": True},
    ]
    # An application kind marked kernel=true answers a park, as the metadata now says.
    assert linked._state[4] == (False, True)
    assert list(batch) == EVENTS
    with pytest.raises(InvalidEventError, match="reserved"):
        batch.with_metadata([{"fence": 1}, {}])
    with pytest.raises(InvalidEventError, match="non-string key"):
        batch.with_metadata([{}, {1: "x"}])  # type: ignore[dict-item]


class PassesOn(EventStoreDecorator):
    """Checks the batch itself, as tenant, crypto and audit do, then passes it down."""

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        batch = check_batch(events)
        return await self.inner.append(
            execution_id, batch, expected_sequence=expected_sequence, fence=fence
        )

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=FORWARD,
        append_many=FORWARD,
        delete_execution=FORWARD,
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=FORWARD,
    )


async def test_a_batch_checked_at_the_top_of_a_stack_is_not_checked_again_below(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked: list[int] = []
    check_event = validation._check_event

    def counting(event: object, i: int) -> Any:
        checked.append(i)
        return check_event(event, i)

    monkeypatch.setattr(validation, "_check_event", counting)
    inner = MemoryEventStore()
    stack = PassesOn(PassesOn(PassesOn(inner)))
    written = await stack.append("e", EVENTS, expected_sequence=0, fence=0)
    assert checked == [0, 1]  # each event once, for three layers and the store
    assert [(e.kind, e.payload, e.metadata) for e in written] == [
        ("order.placed", {"items": [1, 2]}, {"trace": "t1", "fence": 0}),
        ("k", None, {"fence": 0}),
    ]
    assert await inner.read("e") == written

    checked.clear()
    await stack.append_many([AppendRequest("f", EVENTS, 0)])
    assert checked == [0, 1]


async def test_a_bad_batch_is_still_refused_at_the_top_of_a_stack() -> None:
    inner = MemoryEventStore()
    stack = PassesOn(PassesOn(inner))
    with pytest.raises(InvalidEventError, match=r"events\[1\]\.payload is inf"):
        await stack.append("e", [NewEvent("k"), NewEvent("k", float("inf"))],
                           expected_sequence=0)
    assert await inner.head("e") == 0


# (event metadata, extra): every case with_metadata must merge exactly as a dict update
# would, the event's keys first in their order, then the new ones, extra's value winning.
MERGES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {}),
    ({}, {"chain": "h0"}),
    ({"trace": "t1"}, {}),
    ({"trace": "t1"}, {"chain": "h0", "n": 2}),
    ({"a": 1, "b": 2}, {"a": 3}),  # a collision keeps the key's place
    ({"a": 1, "b": 2, "c": 3}, {"c": None, "d": 4, "a": [5]}),
    ({"x": {"a": 1}}, {"a": 2}),  # the same key nested deeper is no collision
    ({"l": ["x", ":y"]}, {",": 1}),  # nor is the key's encoding found across strings
    ({"s": '"a":'}, {"a": 1}),
    ({'a"b': 1, "c\\d": 2, "\n": 3}, {'a"b': 4, "c\\d": 5, "\n": 6}),  # escaped keys
    ({"ключ": "é", "日本": 1}, {"日本": "語", "ключ": "новый", "🙂": "\u2028"}),
    ({"trace": "t1"}, {"n": {"deep": [1, {"x": None, "y": [True, 1.5]}]}}),
    ({"big": 2**70}, {"a": 1}),  # json text (past 64 bits) is merged, never spliced
    ({"a": 1}, {"big": -(2**70)}),
    ({"big": 2**70}, {"big": 1}),
]


@pytest.mark.parametrize(("current", "extra"), MERGES)
def test_with_metadata_is_what_checking_the_merged_event_gives(
    current: dict[str, Any], extra: dict[str, Any]
) -> None:
    batch = check_batch([NewEvent("k", {"p": 1}, current), NewEvent("k", None, current)])
    merged = {**current, **extra}
    linked = batch.with_metadata([extra, dict(extra)])
    expected = check_batch([NewEvent("k", {"p": 1}, merged), NewEvent("k", None, merged)])
    # The same bytes, the same order of keys, the same answers, as a fresh check.
    assert linked._state[1:] == expected._state[1:]
    assert [list(m.items()) for m in linked.metadata()] == [
        list(m.items()) for m in expected.metadata()
    ]
    assert linked.metadata() == (merged, merged)
    # orjson's bytes keep the keys in order, and so does json text (past 64 bits).
    assert list(linked.metadata()[0].items()) == list(merged.items())
    assert list(batch) == [NewEvent("k", {"p": 1}, current), NewEvent("k", None, current)]


def test_one_extra_object_for_every_event_merges_into_each_its_own_way() -> None:
    batch = check_batch(
        [NewEvent("k", 1, {"stamp": "old"}), NewEvent("k", 2), NewEvent("k", 3, {"z": 0})]
    )
    stamp: dict[str, Any] = {"stamp": "new"}
    linked = batch.with_metadata([stamp] * 3)
    assert [list(m.items()) for m in linked.metadata()] == [
        [("stamp", "new")],
        [("stamp", "new")],
        [("z", 0), ("stamp", "new")],
    ]
    stamp["stamp"] = "changed"  # the batch holds what was checked, not the object
    assert linked.metadata()[1] == {"stamp": "new"}


def test_with_metadata_answers_as_the_merged_metadata_says() -> None:
    batch = check_batch(
        [NewEvent("app", None, {"kernel": True}), NewEvent("app"), NewEvent("EXECUTION_RESUMED")]
    )
    assert batch._state[4] == (True, False, True)
    assert batch.with_metadata([{"x": 1}, {}, {}])._state[4] == (True, False, True)
    assert batch.with_metadata([{"kernel": False}, {"kernel": True}, {"kernel": False}])._state[
        4
    ] == (False, True, True)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([{"ok": 1}, {"fence": 1}], r"events\[1\]\.metadata uses the reserved key"),
        ([{"fence": 1}] * 2, r"events\[0\]\.metadata uses the reserved key"),
        ([{}, {"x": float("nan")}], r"events\[1\]\.metadata\.x is nan"),
        ([{"x": {"y": {1, 2}}}, {}], r"events\[0\]\.metadata\.x\.y is a set"),
        ([{"a": "\x00"}, {}], r"events\[0\]\.metadata\.a contains U\+0000"),
        ([{"\ud800": 1}, {}], "lone surrogate"),
        ([{}, ["x"]], r"events\[1\]\.metadata must be a JSON object, not list"),
        ([{}], "one per event"),
        ({"a": 1}, "must be a sequence"),
    ],
)
def test_a_refused_with_metadata_leaves_the_batch_as_it_was(
    extra: Any, message: str
) -> None:
    batch = check_batch(EVENTS)
    state = batch._state
    with pytest.raises(InvalidEventError, match=message):
        batch.with_metadata(extra)
    assert batch._state is state
    assert list(batch) == EVENTS
