"""The required half of the event-store contract: append, read, head, list_executions,
close, capabilities, and every refusal of bad input."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Coroutine
from datetime import timedelta
from functools import partial
from typing import Any, Final

import pytest

from loom_conformance.factory import StorageFactory
from loom_conformance.requirements import COVERAGE_PROPERTY, missing
from loom_conformance.suites._races import MAX_TURNS, race_after_turns
from loom_conformance.suites._support import (
    SAME_VALUES,
    app,
    assert_refused_alike_when_closed,
    assert_the_same_values,
    close_iterator,
    guard,
    kernel,
    list_pages,
    nested,
    scribble,
    snapshot,
)
from loom_core import (
    AppendRequest,
    ConflictError,
    Event,
    EventKind,
    EventStore,
    ExecutionAlreadyExistsError,
    InvalidEventError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    InvalidSequenceError,
    JsonValue,
    NewEvent,
    SequenceConflictError,
    StoreClosedError,
    Unsupported,
)
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, OptionalMethod

__all__ = ["BAD_EXECUTION_IDS", "BAD_PAYLOADS", "EventStoreRequiredContract"]

BAD_EXECUTION_IDS: Final[tuple[object, ...]] = (
    "",
    "nul\x00inside",
    "tab\tinside",
    "del\x7finside",
    "x" * 513,
    "lone\ud800surrogate",
    42,
    None,
    b"bytes-id",
)
"""Execution ids every store refuses with InvalidExecutionIdError."""

BAD_PAYLOADS: Final[tuple[object, ...]] = (
    {1, 2},
    object(),
    float("nan"),
    float("inf"),
    b"raw bytes",
    {1: "non-string key"},
    "nul \x00 in text",
    {"nested": [{"deeper": float("-inf")}]},
)
"""Payloads that are not JSON values (or that a JSON store cannot hold)."""

BAD_SEQUENCES: Final[tuple[object, ...]] = (-1, True, False, 1.0, "0", None, 2**63, 2**200)
BAD_LIMITS: Final[tuple[object, ...]] = (0, -3, True, 1.5, "10", 2**63, 2**200)
"""2**63 and above: every position, fence and limit is a signed 64-bit integer, and a
larger one is refused on every backend (never clamped), before the store is touched."""

LARGEST: Final = 2**63 - 1
"""The largest position or limit every store accepts."""

_VALID_BATCH: Final = (app("order.placed", {"n": 1}),)


def _ids(values: tuple[object, ...]) -> list[str]:
    """Stable, readable test ids (a bare ``object()`` would put its address in the id)."""
    return [
        type(v).__name__ if type(v) is object else repr(v)[:24].replace("\\", "/")
        for v in values
    ]


async def _call_optional(
    store: EventStore, method: OptionalMethod, execution_id: object, *, first_item: bool = False
) -> object:
    """Call ``method`` with otherwise valid arguments (no write happens with a bad id);
    ``first_item`` also awaits a subscription's first event (a store may refuse there)."""
    eid: Any = execution_id
    events = [app()]
    if method == "acquire_fence":
        return await store.acquire_fence(eid)
    if method == "acquire_fence_if":
        return await store.acquire_fence_if(eid, fence=0, park_seq=0)
    if method == "append_if_unchanged":
        return await store.append_if_unchanged(
            eid, events, expected_sequence=0, observed_fence=0
        )
    if method == "append_many":
        return await store.append_many([AppendRequest(eid, events, 0)])
    if method == "delete_execution":
        return await store.delete_execution(eid)
    if method == "copy_prefix":
        return await store.copy_prefix(eid, "copy-target", through_sequence=0)
    if method == "truncate_prefix_keeping":
        return await store.truncate_prefix_keeping(eid, keep_from_sequence=0)
    if method != "subscribe":
        raise ValueError(f"_call_optional does not know the optional method {method!r}")
    iterator = store.subscribe(eid, from_sequence=0)
    try:
        if first_item:
            await anext(iterator)
    finally:
        await close_iterator(iterator)
    return iterator


async def _first_item(store: EventStore, execution_id: str, from_sequence: int) -> object:
    iterator = store.subscribe(execution_id, from_sequence=from_sequence)
    try:
        return await guard(anext(iterator))
    finally:
        await close_iterator(iterator)


_BAD_AFTERS: Final = tuple(a for a in BAD_EXECUTION_IDS if a is not None)
"""``list_executions(after=None)`` means "from the start"; every other bad id is a bad
``after``."""

_BadCall = Callable[[EventStore], Coroutine[Any, Any, object]]

_BAD_CALLS: Final[tuple[tuple[str, OptionalMethod | None, _BadCall], ...]] = (
    ("append, empty id", None, lambda s: s.append("", [app()], expected_sequence=1)),
    ("append, no events", None, lambda s: s.append("exec-closed", [], expected_sequence=1)),
    ("append, negative expected_sequence", None,
     lambda s: s.append("exec-closed", [app()], expected_sequence=-1)),
    ("append, negative fence", None,
     lambda s: s.append("exec-closed", [app()], expected_sequence=1, fence=-1)),
    ("read, empty id", None, lambda s: s.read("")),
    ("read, negative from_sequence", None, lambda s: s.read("exec-closed", from_sequence=-1)),
    ("read, negative to_sequence", None, lambda s: s.read("exec-closed", to_sequence=-1)),
    ("read, limit 0", None, lambda s: s.read("exec-closed", limit=0)),
    ("head, empty id", None, lambda s: s.head("")),
    ("list_executions, empty after", None, lambda s: s.list_executions(after="")),
    ("list_executions, limit 0", None, lambda s: s.list_executions(limit=0)),
    ("acquire_fence, empty id", "acquire_fence", lambda s: s.acquire_fence("")),
    ("acquire_fence_if, negative fence", "acquire_fence_if",
     lambda s: s.acquire_fence_if("exec-closed", fence=-1, park_seq=0)),
    ("acquire_fence_if, negative park_seq", "acquire_fence_if",
     lambda s: s.acquire_fence_if("exec-closed", fence=0, park_seq=-1)),
    ("append_if_unchanged, negative expected_sequence", "append_if_unchanged",
     lambda s: s.append_if_unchanged(
         "exec-closed", [app()], expected_sequence=-1, observed_fence=0)),
    ("append_if_unchanged, negative observed_fence", "append_if_unchanged",
     lambda s: s.append_if_unchanged(
         "exec-closed", [app()], expected_sequence=1, observed_fence=-1)),
    ("append_many, empty id", "append_many",
     lambda s: s.append_many([AppendRequest("", [app()], 0)])),
    ("append_many, negative expected_sequence", "append_many",
     lambda s: s.append_many([AppendRequest("exec-closed", [app()], -1)])),
    ("delete_execution, empty id", "delete_execution", lambda s: s.delete_execution("")),
    ("copy_prefix, empty target", "copy_prefix",
     lambda s: s.copy_prefix("exec-closed", "", through_sequence=0)),
    ("copy_prefix, negative through_sequence", "copy_prefix",
     lambda s: s.copy_prefix("exec-closed", "exec-copy", through_sequence=-1)),
    ("truncate_prefix_keeping, negative keep_from_sequence", "truncate_prefix_keeping",
     lambda s: s.truncate_prefix_keeping("exec-closed", keep_from_sequence=-1)),
    ("subscribe, empty id", "subscribe", lambda s: _first_item(s, "", 0)),
    ("subscribe, negative from_sequence", "subscribe",
     lambda s: _first_item(s, "exec-closed", -1)),
)
"""A call with one bad argument each; every store refuses each with InvalidInputError,
open or closed."""


class EventStoreRequiredContract:
    """Required methods, capabilities and input refusals."""

    # -- append and read ----------------------------------------------------------------

    async def test_append_returns_recorded_events_with_gapless_sequences(
        self, loom_events: EventStore
    ) -> None:
        first = await loom_events.append(
            "exec-1",
            [kernel(EventKind.EXECUTION_STARTED, {"flow": "f"}), app("a.b", [1, 2])],
            expected_sequence=0,
        )
        second = await loom_events.append("exec-1", [app("c", "x")], expected_sequence=2)

        assert [e.sequence for e in (*first, *second)] == [0, 1, 2]
        assert [e.kind for e in (*first, *second)] == ["EXECUTION_STARTED", "a.b", "c"]
        assert all(e.execution_id == "exec-1" for e in (*first, *second))
        assert first[0].payload == {"flow": "f"}
        assert first[1].payload == [1, 2]
        for event in (*first, *second):
            assert event.recorded_at.utcoffset() == timedelta(0), "recorded_at must be UTC"
        assert await loom_events.read("exec-1") == (*first, *second)

    async def test_head_is_the_next_sequence(self, loom_events: EventStore) -> None:
        assert await loom_events.head("never-written") == 0
        await loom_events.append("exec-h", [app(), app()], expected_sequence=0)
        assert await loom_events.head("exec-h") == 2
        await loom_events.append("exec-h", [app()], expected_sequence=2)
        assert await loom_events.head("exec-h") == 3

    async def test_json_payload_and_metadata_round_trip(self, loom_events: EventStore) -> None:
        payloads: list[Any] = [
            None,
            True,
            0,
            -17,
            2**53,
            3.25,
            "text with ünïcödé ∑ and \"quotes\" and \\ backslash",
            [],
            {},
            {"nested": {"list": [1, "two", None, False, {"x": 1.5}]}, "": "empty key"},
        ]
        def metadata(i: int) -> dict[str, Any]:
            # A null value is a value: a store that drops the key loses what it said.
            return {"trace": f"t{i}", "n": i, "tags": ["a"], "parent": None,
                    "nested": {"none": None, "list": [None]}}

        events = [
            NewEvent("kind.payload", payload, metadata(i)) for i, payload in enumerate(payloads)
        ]
        await loom_events.append("exec-json", events, expected_sequence=0)

        read = await loom_events.read("exec-json")
        assert [e.payload for e in read] == payloads
        assert [e.metadata for e in read] == [metadata(i) for i in range(len(payloads))], (
            "metadata must read back exactly as it was appended: a decorator that adds keys "
            "on the way down (with_metadata) takes them off again in every event it hands "
            "up (read, append's result, subscribe, append_many, append_if_unchanged)"
        )

    async def test_payload_values_read_back_with_their_types_and_key_order(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append(
            "exec-types", [NewEvent("k", p) for p in SAME_VALUES], expected_sequence=0
        )
        assert_the_same_values("append", written)
        assert_the_same_values("read", await loom_events.read("exec-types"))

    async def test_metadata_reads_back_with_its_types_and_key_order(
        self, loom_events: EventStore
    ) -> None:
        # As payloads do (SAME_VALUES): a store that writes metadata with sorted keys hands
        # back, from the same append, one order from append and another from read, and
        # another order than a store that keeps them.
        metadata: dict[str, Any] = {
            "trace": "t", "b": 1.0, "a": -0.0, "z": {"y": 2**64 + 5, "c": [1e300]}, "": None,
        }
        written = await loom_events.append(
            "exec-meta-order", [NewEvent("k", None, metadata)], expected_sequence=0
        )
        read = await loom_events.read("exec-meta-order")
        for what, events in (("append", written), ("read", read)):
            assert [repr(e.metadata) for e in events] == [repr(metadata)], (
                f"{what} handed back metadata equal to what was appended but not the same: "
                "a float must stay a float (1.0, not 1), -0.0 keep its sign, and an "
                "object's keys keep the order they were written in"
            )

    async def test_a_tuple_payload_reads_back_as_a_list(self, loom_events: EventStore) -> None:
        await loom_events.append(
            "exec-t", [NewEvent("k", (1, (2, 3)))], expected_sequence=0  # type: ignore[arg-type]
        )
        assert (await loom_events.read("exec-t"))[0].payload == [1, [2, 3]]

    async def test_read_results_are_copies_the_caller_cannot_corrupt(
        self, loom_events: EventStore
    ) -> None:
        payload: dict[str, Any] = {"items": [1, 2]}
        await loom_events.append("exec-c", [NewEvent("k", payload, {"m": 1})], expected_sequence=0)
        payload["items"].append("mutated after append")
        event = (await loom_events.read("exec-c"))[0]
        assert isinstance(event.payload, dict)
        items = event.payload["items"]
        assert isinstance(items, list)
        items.append("mutated after read")
        event.metadata["m"] = 2

        again = (await loom_events.read("exec-c"))[0]
        assert again.payload == {"items": [1, 2]}
        assert again.metadata == {"m": 1}

    async def test_append_results_are_copies_the_caller_cannot_corrupt(
        self, loom_events: EventStore
    ) -> None:
        """What ``append`` returns belongs to the caller: changing it changes neither the
        log nor what a later read or append returns. One event and a batch, unfenced and
        fenced (which stamps the metadata it returns), since stores often build each of
        these returns in a way of its own."""
        returned = [
            await loom_events.append("exec-c", [nested(n=0)], expected_sequence=0),
            await loom_events.append(
                "exec-c", [nested(n=1), nested(n=2)], expected_sequence=1
            ),
            await loom_events.append("exec-c", [nested(n=3)], expected_sequence=3, fence=0),
            await loom_events.append(
                "exec-c", [nested(n=4), nested(n=5)], expected_sequence=4, fence=0
            ),
        ]
        kept = await loom_events.read("exec-c")
        for written in returned:
            scribble(written)

        assert await loom_events.read("exec-c") == kept, (
            "changing the events append returned changed what read returns: append must "
            "return copies, not the objects the store keeps"
        )
        # The same event again: a store that keeps one decoded object per text hands it on.
        again = await loom_events.append("exec-c", [nested(n=0)], expected_sequence=6)
        assert (again[0].payload, again[0].metadata) == (
            nested(n=0).payload, nested(n=0).metadata
        ), "changing the events one append returned changed what the next append returned"

    async def test_unfenced_append_stamps_no_fence(self, loom_events: EventStore) -> None:
        written = await loom_events.append("exec-u", [app(trace="t")], expected_sequence=0)
        assert written[0].metadata == {"trace": "t"}
        assert written[0].fence == 0
        assert (await loom_events.read("exec-u"))[0].metadata == {"trace": "t"}

    async def test_fenced_append_stamps_the_fence_on_every_event(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append(
            "exec-f", [app(trace="t"), app()], expected_sequence=0, fence=0
        )
        assert [e.metadata for e in written] == [{"trace": "t", "fence": 0}, {"fence": 0}]
        assert [e.metadata for e in await loom_events.read("exec-f")] == [
            {"trace": "t", "fence": 0},
            {"fence": 0},
        ]

    async def test_read_ranges_are_inclusive_and_limited(self, loom_events: EventStore) -> None:
        await loom_events.append("exec-r", [app(payload=i) for i in range(6)], expected_sequence=0)

        async def seqs(**kwargs: Any) -> list[int]:
            return [e.sequence for e in await loom_events.read("exec-r", **kwargs)]

        assert await seqs() == [0, 1, 2, 3, 4, 5]
        assert await seqs(from_sequence=2) == [2, 3, 4, 5]
        assert await seqs(to_sequence=3) == [0, 1, 2, 3]
        assert await seqs(from_sequence=1, to_sequence=4) == [1, 2, 3, 4]
        assert await seqs(from_sequence=3, to_sequence=3) == [3]
        assert await seqs(from_sequence=1, limit=2) == [1, 2]
        assert await seqs(from_sequence=1, to_sequence=2, limit=10) == [1, 2]
        assert await seqs(from_sequence=4, to_sequence=1) == []
        assert await seqs(from_sequence=6) == []
        assert await seqs(from_sequence=600) == []
        assert await seqs(to_sequence=600) == [0, 1, 2, 3, 4, 5]

    async def test_reading_an_unknown_execution_is_empty(self, loom_events: EventStore) -> None:
        assert await loom_events.read("no-such-execution") == ()
        assert await loom_events.list_executions() == ()

    async def test_results_are_tuples_of_the_documented_types(
        self, loom_events: EventStore
    ) -> None:
        appended = await loom_events.append("exec-r", [app(), app()], expected_sequence=0)
        results: list[tuple[str, object, type]] = [
            ("append", appended, Event),
            ("read", await loom_events.read("exec-r"), Event),
            ("read of an unknown id", await loom_events.read("no-such-execution"), Event),
            ("list_executions", await loom_events.list_executions(), str),
        ]
        for method, result, item in results:
            assert isinstance(result, tuple), (
                f"{method} returned a {type(result).__name__}; the EventStore protocol "
                f"returns a tuple of {item.__name__} (callers compare it with (), and keep it)"
            )
            assert all(isinstance(x, item) for x in result), (
                f"{method} returned {[type(x).__name__ for x in result]}; "
                f"every item must be a {item.__name__}"
            )
        head = await loom_events.head("exec-r")
        assert type(head) is int, f"head returned a {type(head).__name__}, not an int"

    async def test_append_leaves_the_events_it_was_given_as_they_were(
        self, loom_events: EventStore
    ) -> None:
        given = [
            NewEvent("k", {"items": [1, {"x": None}]}, {"trace": {"path": [0]}}),
            kernel(EventKind.EXECUTION_STARTED, {"flow": "f"}),
        ]
        before = [(e.kind, copy.deepcopy(e.payload), copy.deepcopy(e.metadata)) for e in given]
        await loom_events.append("exec-g", given, expected_sequence=0)
        after = [(e.kind, e.payload, e.metadata) for e in given]
        assert after == before, (
            "append changed the events it was given (a key added to a metadata or payload "
            "dict the caller owns): a store or decorator must build new events, never "
            "write into the caller's (check_batch(...).with_metadata or .with_payloads, "
            f"or copies); before {before!r}, after {after!r}"
        )

    # -- conflicts ----------------------------------------------------------------------

    async def test_append_behind_the_head_is_a_sequence_conflict_with_the_actual_head(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-s", [app(), app(), app()], expected_sequence=0)
        before = await snapshot(loom_events)

        for expected in (1, 2, 4, 100):
            with pytest.raises(SequenceConflictError) as caught:
                await loom_events.append("exec-s", [app()], expected_sequence=expected)
            assert caught.value.actual_head == 3
            assert caught.value.expected_sequence == expected
            assert caught.value.execution_id == "exec-s"
            assert isinstance(caught.value, ConflictError)
        assert await snapshot(loom_events) == before

    async def test_append_past_zero_to_a_missing_execution_is_a_sequence_conflict(
        self, loom_events: EventStore
    ) -> None:
        with pytest.raises(SequenceConflictError) as caught:
            await loom_events.append("exec-missing", [app()], expected_sequence=1)
        assert caught.value.actual_head == 0
        assert await loom_events.list_executions() == ()
        assert await loom_events.head("exec-missing") == 0

    async def test_creating_an_existing_execution_is_refused_with_its_head(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-e", [app(), app()], expected_sequence=0)
        before = await snapshot(loom_events)
        with pytest.raises(ExecutionAlreadyExistsError) as caught:
            await loom_events.append("exec-e", [app("dup")], expected_sequence=0)
        assert caught.value.execution_id == "exec-e"
        assert caught.value.actual_head == 2
        assert isinstance(caught.value, ConflictError)
        assert await snapshot(loom_events) == before

    async def test_concurrent_appends_at_one_sequence_have_exactly_one_winner(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-race", [app()], expected_sequence=0)
        results = await guard(
            asyncio.gather(
                *(
                    loom_events.append("exec-race", [app(payload=i)], expected_sequence=1)
                    for i in range(8)
                ),
                return_exceptions=True,
            )
        )
        winners = [r for r in results if isinstance(r, tuple)]
        losers = [r for r in results if not isinstance(r, tuple)]
        assert len(winners) == 1, results
        assert all(isinstance(r, SequenceConflictError) for r in losers), losers
        assert all(r.actual_head == 2 for r in losers if isinstance(r, SequenceConflictError))
        log = await loom_events.read("exec-race")
        assert [e.sequence for e in log] == [0, 1]
        assert log[1] == winners[0][0]

    async def test_a_batch_is_seen_whole_or_not_at_all_by_a_racing_reader_and_writer(
        self, loom_events: EventStore
    ) -> None:
        # A store suspended between the events of one batch (an await per row written)
        # would show a reader half of it, and let a writer append at that half's head.
        for turns in range(MAX_TURNS):
            execution_id = f"exec-batch-{turns}"
            batch = [app(payload=[turns, i]) for i in range(3)]

            async def rival(execution_id: str = execution_id) -> tuple[int, object]:
                head = await loom_events.head(execution_id)
                try:
                    written: object = await loom_events.append(
                        execution_id, [app("rival")], expected_sequence=head
                    )
                except ConflictError as error:
                    written = error
                return head, written

            race = await race_after_turns(
                loom_events.append(execution_id, batch, expected_sequence=0), rival, turns
            )
            assert not isinstance(race.second, Exception), race.second
            head, _ = race.second
            assert head in (0, 3), (
                f"a reader saw head {head} while a batch of 3 was appended at sequence 0 "
                f"(after a head start of {turns} loop turn(s)): it saw part of the batch. "
                "Write a batch in one atomic step (no await between its events; one "
                "transaction)"
            )
            log = await loom_events.read(execution_id)
            assert [e.sequence for e in log] == list(range(len(log))), (
                f"the log of {execution_id!r} has sequences {[e.sequence for e in log]} "
                "after a batch and a racing append: two events at one sequence"
            )
            batch_payloads = [e.payload for e in log if e.kind != "rival"]
            if isinstance(race.first, Exception):
                # The rival created the log first: a refusal that wrote nothing.
                assert isinstance(race.first, ConflictError), race.first
                assert batch_payloads == [], log
            else:
                assert batch_payloads == [[turns, i] for i in range(3)], log

    async def test_concurrent_creates_have_exactly_one_winner(
        self, loom_events: EventStore
    ) -> None:
        results = await guard(
            asyncio.gather(
                *(
                    loom_events.append("exec-new", [app(payload=i)], expected_sequence=0)
                    for i in range(8)
                ),
                return_exceptions=True,
            )
        )
        assert sum(isinstance(r, tuple) for r in results) == 1, results
        assert all(
            isinstance(r, ExecutionAlreadyExistsError) for r in results if not isinstance(r, tuple)
        )
        assert await loom_events.head("exec-new") == 1

    async def test_concurrent_writers_that_retry_keep_the_log_gapless(
        self, loom_events: EventStore
    ) -> None:
        async def writer(n: int) -> None:
            for i in range(3):
                # Each conflict means another writer landed; 12 appends in all bound them.
                for _ in range(100):
                    head = await loom_events.head("exec-g")
                    try:
                        await loom_events.append(
                            "exec-g", [app(payload=[n, i])], expected_sequence=head
                        )
                        break
                    except ConflictError:
                        await asyncio.sleep(0)
                else:
                    raise AssertionError(
                        f"writer {n} was refused 100 times at the head it had just read"
                    )

        await guard(asyncio.gather(*(writer(n) for n in range(4))))
        log = await loom_events.read("exec-g")
        assert [e.sequence for e in log] == list(range(12))
        assert sorted(str(e.payload) for e in log) == sorted(
            str([n, i]) for n in range(4) for i in range(3)
        )

    # -- list_executions ----------------------------------------------------------------

    async def test_list_executions_is_in_ascending_code_point_order(
        self, loom_events: EventStore
    ) -> None:
        # U+FB01 and U+FF61 sort below U+10000 and U+1F600 by code point and above them
        # by UTF-16 code unit (the surrogates that encode them are D800-DFFF), so a store
        # that orders by UTF-16 (some collations, a JVM or .NET string compare) fails here.
        ids = [
            "b", "B", "a", "a-2", "a:1", "é", "Z", "é-2", "0", "~",
            "\uff61x", "\U0001F600x", "\ufb01x", "\U00010000x", "\uff61",
        ]
        for execution_id in ids:
            await loom_events.append(execution_id, [app()], expected_sequence=0)
        expected = tuple(sorted(ids))
        assert await loom_events.list_executions() == expected, (
            "list_executions must order ids by code point (as Python's sorted() and "
            "UTF-8 bytes do), not by UTF-16 code unit or a locale's collation"
        )
        # ``after`` compares the same way: one id a page walks the same order.
        walked = [i for page in await list_pages(loom_events, limit=1) for i in page]
        assert walked == [*expected], (
            "paging with `after` must compare ids by code point too, as the order does"
        )
        assert await loom_events.list_executions(after="\ufb01x") == expected[
            expected.index("\ufb01x") + 1 :
        ]

    async def test_list_executions_pages_cover_every_id_once_in_stable_order(
        self, loom_events: EventStore
    ) -> None:
        ids = sorted(f"page-{i:03d}" for i in range(23))
        for execution_id in reversed(ids):
            await loom_events.append(execution_id, [app()], expected_sequence=0)

        pages = await list_pages(loom_events, limit=5)
        assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
        assert [i for p in pages for i in p] == ids
        assert await loom_events.list_executions(after="page-010", limit=2) == (
            "page-011",
            "page-012",
        )
        # ``after`` need not exist: the page starts strictly after it.
        assert await loom_events.list_executions(after="page-0105", limit=1) == ("page-011",)
        assert await loom_events.list_executions(after="page-022") == ()

    # -- capabilities and refusals ------------------------------------------------------

    async def test_capabilities_name_only_optional_methods_and_are_stable(
        self, loom_events: EventStore
    ) -> None:
        offered = loom_events.capabilities
        assert isinstance(offered, frozenset)
        assert offered <= set(OPTIONAL_EVENT_STORE_METHODS), offered
        await loom_events.append("exec-cap", [app()], expected_sequence=0)
        assert loom_events.capabilities == offered

    @pytest.mark.parametrize("method", OPTIONAL_EVENT_STORE_METHODS)
    async def test_optional_method_is_offered_or_refused_with_unsupported(
        self, loom_events: EventStore, method: OptionalMethod, request: pytest.FixtureRequest
    ) -> None:
        """Either branch is checked, so no optional method goes untested: an offered
        method exists (bad input gets InvalidInputError, not Unsupported); one that is not
        offered raises Unsupported naming it, even with valid arguments, and writes
        nothing."""
        await loom_events.append("exec-src", [app(), app()], expected_sequence=0)
        before = await snapshot(loom_events, "exec-new")
        if method in loom_events.capabilities:
            with pytest.raises(InvalidExecutionIdError):
                await _call_optional(loom_events, method, "bad\x00id")
        else:
            with pytest.raises(Unsupported) as caught:
                await _call_optional(
                    loom_events, method, "exec-src" if method == "copy_prefix" else "exec-new"
                )
            assert caught.value.method == method
            assert method in str(caught.value)
            assert isinstance(caught.value, NotImplementedError)
        assert await snapshot(loom_events, "exec-new") == before
        # Read by the plugin's end-of-run summary of which branch each method took.
        request.node.user_properties.append(
            (COVERAGE_PROPERTY, (method, method in loom_events.capabilities))
        )

    # -- bad input ----------------------------------------------------------------------

    @pytest.mark.parametrize("execution_id", BAD_EXECUTION_IDS, ids=_ids(BAD_EXECUTION_IDS))
    async def test_bad_execution_id_is_refused_everywhere_and_writes_nothing(
        self, loom_events: EventStore, execution_id: object
    ) -> None:
        await loom_events.append("exec-ok", [app()], expected_sequence=0)
        before = await snapshot(loom_events)
        eid: Any = execution_id
        calls: list[Callable[[], Coroutine[Any, Any, object]]] = [
            lambda: loom_events.append(eid, [app()], expected_sequence=0),
            lambda: loom_events.append(eid, [app()], expected_sequence=0, fence=0),
            lambda: loom_events.read(eid),
            lambda: loom_events.head(eid),
        ]
        if execution_id is not None:  # list_executions(after=None) means "from the start"
            calls.append(lambda: loom_events.list_executions(after=eid))
        for call in calls:
            with pytest.raises(InvalidExecutionIdError) as caught:
                await call()
            assert caught.value.value == execution_id
            assert isinstance(caught.value, InvalidInputError)
        for method in sorted(loom_events.capabilities):
            with pytest.raises(InvalidExecutionIdError):
                await _call_optional(loom_events, method, execution_id)
        assert await snapshot(loom_events) == before

    @pytest.mark.parametrize("after", _BAD_AFTERS, ids=_ids(_BAD_AFTERS))
    async def test_a_bad_after_is_refused_naming_after(
        self, loom_events: EventStore, after: object
    ) -> None:
        """``after`` is a position, not an execution id: its refusal names the argument."""
        bad: Any = after
        with pytest.raises(InvalidExecutionIdError) as caught:
            await loom_events.list_executions(after=bad)
        assert caught.value.what == "after"
        assert str(caught.value).startswith("invalid after "), str(caught.value)

    @pytest.mark.parametrize("payload", BAD_PAYLOADS, ids=_ids(BAD_PAYLOADS))
    async def test_non_json_payload_is_refused_and_writes_nothing(
        self, loom_events: EventStore, payload: object
    ) -> None:
        await loom_events.append("exec-ok", [app()], expected_sequence=0)
        before = await snapshot(loom_events, "exec-new")
        bad = NewEvent("k", payload)  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError):
            await loom_events.append("exec-ok", [app(), bad], expected_sequence=1)
        with pytest.raises(InvalidEventError):
            await loom_events.append("exec-new", [bad], expected_sequence=0)
        with pytest.raises(InvalidEventError):
            await loom_events.append("exec-new", [NewEvent("k", None, {"m": payload})],  # type: ignore[dict-item]
                                     expected_sequence=0)
        assert await snapshot(loom_events, "exec-new") == before

    async def test_bad_events_are_refused_and_write_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-ok", [app()], expected_sequence=0)
        before = await snapshot(loom_events)
        bad_batches: list[object] = [
            [],
            (),
            NewEvent("not-in-a-list"),
            [app(), {"kind": "a dict, not a NewEvent"}],
            [NewEvent("")],
            [NewEvent(42)],  # type: ignore[arg-type]
            [NewEvent("kind\x00with-nul")],
            [NewEvent("kind\nwith-newline")],
            [NewEvent("k" * 201)],
            [NewEvent("k", None, ["metadata", "not", "an", "object"])],  # type: ignore[arg-type]
            [NewEvent("k", None, {1: "non-string key"})],  # type: ignore[dict-item]
        ]
        for batch in bad_batches:
            events: Any = batch
            with pytest.raises(InvalidEventError):
                await loom_events.append("exec-ok", events, expected_sequence=1)
            with pytest.raises(InvalidEventError):
                await loom_events.append("exec-ok", events, expected_sequence=1, fence=0)
        assert await snapshot(loom_events) == before

    async def test_reserved_fence_metadata_is_refused_and_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-ok", [app()], expected_sequence=0)
        before = await snapshot(loom_events)
        for fence_value in (0, 7, "7", None):
            forged = NewEvent("k", None, {"fence": fence_value})
            with pytest.raises(InvalidEventError) as caught:
                await loom_events.append("exec-ok", [app(), forged], expected_sequence=1)
            assert "fence" in str(caught.value)
            with pytest.raises(InvalidEventError):
                await loom_events.append("exec-ok", [forged], expected_sequence=1, fence=0)
        assert await snapshot(loom_events) == before

    @pytest.mark.parametrize("value", BAD_SEQUENCES, ids=_ids(BAD_SEQUENCES))
    async def test_bad_sequence_or_fence_is_refused_and_writes_nothing(
        self, loom_events: EventStore, value: object
    ) -> None:
        await loom_events.append("exec-ok", [app()], expected_sequence=0)
        before = await snapshot(loom_events)
        v: Any = value
        calls: list[Callable[[], Coroutine[Any, Any, object]]] = [
            lambda: loom_events.append("exec-ok", [app()], expected_sequence=v),
            lambda: loom_events.read("exec-ok", from_sequence=v),
        ]
        if value is not None:  # None means "no fence" / "to the end": both valid
            calls += [
                lambda: loom_events.append("exec-ok", [app()], expected_sequence=1, fence=v),
                lambda: loom_events.read("exec-ok", to_sequence=v),
            ]
        for call in calls:
            with pytest.raises(InvalidSequenceError):
                await call()
        assert await snapshot(loom_events) == before

    @pytest.mark.parametrize("limit", BAD_LIMITS, ids=_ids(BAD_LIMITS))
    async def test_bad_limit_is_refused(self, loom_events: EventStore, limit: object) -> None:
        await loom_events.append("exec-ok", [app()], expected_sequence=0)
        lim: Any = limit
        with pytest.raises(InvalidOptionError):
            await loom_events.read("exec-ok", limit=lim)
        with pytest.raises(InvalidOptionError):
            await loom_events.list_executions(limit=lim)

    async def test_the_largest_64_bit_position_and_limit_are_accepted(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append("exec-ok", [app(), app()], expected_sequence=0)
        assert await loom_events.read("exec-ok", limit=LARGEST) == written
        assert await loom_events.read("exec-ok", to_sequence=LARGEST) == written
        assert await loom_events.read("exec-ok", from_sequence=LARGEST) == ()
        assert await loom_events.list_executions(limit=LARGEST) == ("exec-ok",)
        with pytest.raises(SequenceConflictError):
            await loom_events.append("exec-ok", [app()], expected_sequence=LARGEST)

    @pytest.mark.parametrize("value", [2**63, 2**64 + 5], ids=["2**63", "2**64+5"])
    async def test_subscribe_past_64_bits_is_refused(
        self, loom_events: EventStore, value: int
    ) -> None:
        reason = missing(frozenset(loom_events.capabilities), ("subscribe",), ())
        if reason is not None:
            pytest.skip(reason)
        # Refused when called, or at the latest on the first item.
        with pytest.raises(InvalidSequenceError):
            await _first_item(loom_events, "exec-ok", value)

    @pytest.mark.parametrize("bits", [14_001, 14_300, 20_000], ids=lambda b: f"{b}-bits")
    async def test_an_integer_too_large_for_any_store_is_refused_and_writes_nothing(
        self, loom_events: EventStore, bits: int
    ) -> None:
        await loom_events.append("exec-ok", [app()], expected_sequence=0)
        before = await snapshot(loom_events, "exec-new")
        huge = 1 << (bits - 1)
        payloads: list[JsonValue] = [huge, -huge, {"deep": [1, {"n": huge}]}]
        for payload in payloads:
            with pytest.raises(InvalidEventError, match="bits"):
                await loom_events.append("exec-ok", [app(payload=payload)], expected_sequence=1)
            with pytest.raises(InvalidEventError):
                await loom_events.append(
                    "exec-new", [NewEvent("k", None, {"n": huge})], expected_sequence=0
                )
        assert await snapshot(loom_events, "exec-new") == before

    async def test_the_largest_accepted_integer_round_trips(
        self, loom_events: EventStore
    ) -> None:
        big = (1 << 14_000) - 1
        written = await loom_events.append(
            "exec-ok", [app(payload={"n": big, "m": -big})], expected_sequence=0
        )
        assert (await loom_events.read("exec-ok")) == written
        assert written[0].payload == {"n": big, "m": -big}

    # -- close --------------------------------------------------------------------------

    async def test_every_method_after_close_raises_store_closed(
        self, loom_storage_factory: StorageFactory
    ) -> None:
        storage = await loom_storage_factory()
        events = storage.events
        await events.append("exec-closed", [app()], expected_sequence=0)
        offered = events.capabilities
        await storage.close()
        calls: list[tuple[str, Callable[[], Coroutine[Any, Any, object]]]] = [
            ("append", lambda: events.append("exec-closed", [app()], expected_sequence=1)),
            ("append fenced", lambda: events.append(
                "exec-closed", [app()], expected_sequence=1, fence=0)),
            ("read", lambda: events.read("exec-closed")),
            ("head", lambda: events.head("exec-closed")),
            ("list_executions", lambda: events.list_executions()),
        ]
        calls += [
            (method, partial(_call_optional, events, method, "exec-closed", first_item=True))
            for method in OPTIONAL_EVENT_STORE_METHODS
            if method in offered
        ]
        escaped: list[str] = []
        for name, call in calls:
            try:
                await guard(call())
            except StoreClosedError:
                continue
            except Exception as exc:
                escaped.append(f"{name}: {type(exc).__name__}: {exc}")
            else:
                escaped.append(f"{name}: returned normally")
        assert not escaped, f"calls after close() that did not raise StoreClosedError: {escaped}"
        await storage.close()  # still harmless


    async def test_bad_input_on_a_closed_store_is_refused_as_bad_input(
        self, loom_storage_factory: StorageFactory
    ) -> None:
        """Arguments are checked before the store is: a call with a bad argument raises the
        same InvalidInputError on a closed store as on an open one (never
        StoreClosedError), so what is wrong with a call does not depend on the store's
        state."""
        storage = await loom_storage_factory()
        events = storage.events
        await events.append("exec-closed", [app()], expected_sequence=0)
        calls = [
            (name, partial(call, events)) for name, needs, call in _BAD_CALLS
            if needs is None or needs in events.capabilities
        ]
        await assert_refused_alike_when_closed(calls, storage.close, "store")

    async def test_close_is_idempotent(self, loom_storage_factory: StorageFactory) -> None:
        storage = await loom_storage_factory()
        await storage.events.append("exec-close", [app()], expected_sequence=0)
        await storage.events.close()
        await storage.events.close()
        await storage.close()
        await storage.close()
        assert storage.closed
