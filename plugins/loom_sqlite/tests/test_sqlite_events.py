"""The SQLite event store against the SPI contract, as a user of ``open_storage`` sees it.

The shared conformance kit runs in ``test_sqlite_conformance.py``; these cases pin the
behaviour that is specific to (or easiest to get wrong on) SQLite: values surviving the
round trip through JSON text, the fence table, the answered-park scan, group commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
import warnings
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from loom_sqlite import subscribe

from loom_core import (
    AppendRequest,
    Event,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceAcquired,
    FenceStale,
    InvalidEventError,
    InvalidInputError,
    InvalidOptionError,
    InvalidSequenceError,
    JsonValue,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    Storage,
    open_storage,
)
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS


async def _park(storage: Storage, execution_id: str) -> int:
    """Start ``execution_id`` under a fence and park it; returns the park's token."""
    token = await storage.events.acquire_fence(execution_id)
    await storage.events.append(
        execution_id,
        [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED", {"on": "timer"})],
        expected_sequence=0,
        fence=token,
    )
    return token


async def test_offers_every_optional_method(storage: Storage) -> None:
    assert storage.events.capabilities == frozenset(OPTIONAL_EVENT_STORE_METHODS)


async def test_appended_events_read_back_equal(storage: Storage) -> None:
    payload: JsonValue = {
        "n": 1, "f": -0.5, "big": 2**70, "s": "é\u2028", "l": [None, True, {"x": []}]
    }
    written = await storage.events.append(
        "e1",
        [NewEvent("STEP_COMPLETED", payload, {"trace": "t-1"}), NewEvent("order.shipped")],
        expected_sequence=0,
    )
    read = await storage.events.read("e1")
    assert read == written
    assert [e.sequence for e in read] == [0, 1]
    assert read[0].payload == payload
    assert read[0].metadata == {"trace": "t-1"}
    assert read[0].recorded_at.tzinfo is not None
    assert await storage.events.head("e1") == 2


async def test_read_range_is_inclusive_and_limited(storage: Storage) -> None:
    await storage.events.append(
        "e1", [NewEvent("STEP_COMPLETED", {"i": i}) for i in range(6)], expected_sequence=0
    )
    window = await storage.events.read("e1", from_sequence=1, to_sequence=4, limit=2)
    assert [e.sequence for e in window] == [1, 2]
    tail = await storage.events.read("e1", from_sequence=3, to_sequence=4)
    assert [e.sequence for e in tail] == [3, 4]
    assert await storage.events.read("missing") == ()


async def test_recorded_at_comes_from_the_clock_option(db_url: str) -> None:
    instant = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    async with open_storage(db_url, options={"clock": lambda: instant}) as storage:
        written = await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
        assert written[0].recorded_at == instant
        assert (await storage.events.read("e"))[0].recorded_at == instant


async def test_a_clock_past_the_year_9999_in_utc_is_refused_and_writes_nothing(
    db_url: str,
) -> None:
    # 9999-12-31 23:00 at -05:00 is 10000-01-01 04:00 UTC: no datetime can hold it.
    now = [datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))]
    async with open_storage(db_url, options={"clock": lambda: now[0]}) as storage:
        with pytest.raises(InvalidOptionError, match="the storage clock returned"):
            await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
        with pytest.raises(InvalidOptionError, match="the storage clock returned"):
            await storage.leases.acquire("k", "node-a", ttl_seconds=5)
        now[0] = datetime(2031, 1, 1, tzinfo=UTC)
        assert await storage.events.read("e") == ()
        assert await storage.events.head("e") == 0
        assert await storage.leases.inspect("k") is None


async def test_moved_head_is_a_sequence_conflict_and_writes_nothing(storage: Storage) -> None:
    await storage.events.append("e1", [NewEvent("A")], expected_sequence=0)
    with pytest.raises(SequenceConflictError) as caught:
        await storage.events.append("e1", [NewEvent("B"), NewEvent("C")], expected_sequence=5)
    assert caught.value.actual_head == 1
    with pytest.raises(ExecutionAlreadyExistsError):
        await storage.events.append("e1", [NewEvent("B")], expected_sequence=0)
    assert [e.kind for e in await storage.events.read("e1")] == ["A"]


async def test_bad_input_is_refused_before_anything_is_written(storage: Storage) -> None:
    with pytest.raises(InvalidEventError):
        await storage.events.append("e1", [NewEvent("A", {"fence": 1}, {"fence": 2})],
                                    expected_sequence=0)
    with pytest.raises(InvalidEventError):
        await storage.events.append("e1", [NewEvent("A", float("nan"))], expected_sequence=0)
    with pytest.raises(InvalidInputError):
        await storage.events.append("", [NewEvent("A")], expected_sequence=0)
    with pytest.raises(InvalidSequenceError):
        await storage.events.append("e1", [NewEvent("A")], expected_sequence=-1)
    assert await storage.events.head("e1") == 0
    assert await storage.events.list_executions() == ()


async def test_list_executions_pages_in_code_point_order(storage: Storage) -> None:
    ids = ["b", "a", "Z", "é", "aa", "\u4e2d"]
    for execution_id in ids:
        await storage.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
    first = await storage.events.list_executions(limit=3)
    rest = await storage.events.list_executions(after=first[-1], limit=10)
    assert first + rest == tuple(sorted(ids))


async def test_fenced_append_stamps_the_token_and_a_stale_one_is_refused(
    storage: Storage,
) -> None:
    old = await storage.events.acquire_fence("e1")
    written = await storage.events.append("e1", [NewEvent("A")], expected_sequence=0, fence=old)
    assert written[0].fence == old == 1
    new = await storage.events.acquire_fence("e1")
    with pytest.raises(StaleFenceError) as caught:
        await storage.events.append("e1", [NewEvent("B")], expected_sequence=1, fence=old)
    assert caught.value.current_fence == new == 2
    unfenced = await storage.events.append("e1", [NewEvent("DENIED")], expected_sequence=1)
    assert unfenced[0].fence == 0
    assert "fence" not in unfenced[0].metadata
    assert [e.kind for e in await storage.events.read("e1")] == ["A", "DENIED"]


async def test_a_fenced_append_stores_its_stamp_as_the_encoders_text(
    storage: Storage, db_path: Path
) -> None:
    """The stamp's text is written without the encoder: it must be the encoder's text
    byte for byte, alone and merged after an event's own metadata, whose keys keep their
    order."""
    from loom_core.spi import json_text

    tokens = []
    for _ in range(3):
        tokens.append(await storage.events.acquire_fence("e"))
    await storage.events.append("e", [NewEvent("A")], expected_sequence=0, fence=tokens[-1])
    await storage.events.append(
        "e", [NewEvent("B"), NewEvent("C", metadata={"z": 1, "a": [2]})],
        expected_sequence=1, fence=tokens[-1],
    )
    with sqlite3.connect(db_path) as raw:
        stored = [
            row[0]
            for row in raw.execute(
                "SELECT metadata FROM loom_events WHERE execution_id = 'e' ORDER BY sequence"
            )
        ]
    assert stored == [
        json_text({"fence": 3}),
        json_text({"fence": 3}),
        '{"z":1,"a":[2],"fence":3}',
    ]
    assert [e.fence for e in await storage.events.read("e")] == [3, 3, 3]


async def test_acquire_fence_if_wins_then_the_old_token_is_stale(storage: Storage) -> None:
    token = await _park(storage, "p")
    result = await storage.events.acquire_fence_if("p", fence=token, park_seq=1)
    assert result == FenceAcquired(token + 1)
    again = await storage.events.acquire_fence_if("p", fence=token, park_seq=1)
    assert again == FenceStale(token + 1)


@pytest.mark.parametrize(
    "kind",
    [
        "EXECUTION_RESUMED",
        "EXECUTION_SUSPENDED",
        "EXECUTION_COMPLETED",
        "EXECUTION_FAILED",
        "EXECUTION_CANCELLED",
        "EXECUTION_CONTINUED",
    ],
)
async def test_an_answering_event_past_the_park_makes_acquire_fence_if_stale(
    storage: Storage, kind: str
) -> None:
    token = await _park(storage, "p")
    await storage.events.append("p", [NewEvent(kind)], expected_sequence=2, fence=token)
    assert await storage.events.acquire_fence_if("p", fence=token, park_seq=1) == FenceStale(token)
    assert await storage.events.acquire_fence("p") == token + 1  # nothing was bumped


@pytest.mark.parametrize(
    ("kind", "metadata"),
    [
        ("EXECUTION_DENIED", {}),
        ("OUTCOME_RECORDED", {}),
        ("STEP_FAILED", {}),
        ("MESSAGE_CONSUMED", {}),
        ("EXECUTION_MIGRATED", {}),
        ("STEP_COMPLETED", {}),
        ("order.shipped", {}),
        ("future.kind", {"kernel": "true"}),
        ("future.kind", {"kernel": 1}),
        ("future.kind", {"kernel": False}),
        ("EXECUTION_DENIED", {"kernel": True}),
    ],
)
async def test_an_ignorable_event_past_the_park_does_not_make_it_stale(
    storage: Storage, kind: str, metadata: dict[str, object]
) -> None:
    token = await _park(storage, "p")
    await storage.events.append("p", [NewEvent(kind, None, metadata)], expected_sequence=2)  # type: ignore[arg-type]
    assert await storage.events.acquire_fence_if("p", fence=token, park_seq=1) == FenceAcquired(
        token + 1
    )


async def test_an_unknown_kind_stamped_kernel_true_answers_the_park(storage: Storage) -> None:
    token = await _park(storage, "p")
    await storage.events.append(
        "p", [NewEvent("FUTURE_KERNEL_KIND", None, {"kernel": True})], expected_sequence=2
    )
    assert await storage.events.acquire_fence_if("p", fence=token, park_seq=1) == FenceStale(token)


async def test_an_answer_at_or_before_the_park_does_not_make_it_stale(storage: Storage) -> None:
    token = await storage.events.acquire_fence("p")
    await storage.events.append(
        "p",
        [
            NewEvent("EXECUTION_SUSPENDED"),
            NewEvent("EXECUTION_RESUMED"),
            NewEvent("EXECUTION_SUSPENDED"),
        ],
        expected_sequence=0,
        fence=token,
    )
    assert await storage.events.acquire_fence_if("p", fence=token, park_seq=2) == FenceAcquired(
        token + 1
    )


async def test_a_never_fenced_park_expects_token_zero(storage: Storage) -> None:
    await storage.events.append("p", [NewEvent("EXECUTION_SUSPENDED")], expected_sequence=0)
    assert await storage.events.acquire_fence_if("p", fence=0, park_seq=0) == FenceAcquired(1)
    assert await storage.events.acquire_fence_if("p", fence=0, park_seq=0) == FenceStale(1)


async def test_concurrent_conditional_acquires_have_one_winner(storage: Storage) -> None:
    token = await _park(storage, "p")
    results = await asyncio.gather(
        *(storage.events.acquire_fence_if("p", fence=token, park_seq=1) for _ in range(8))
    )
    assert sum(isinstance(r, FenceAcquired) for r in results) == 1
    assert all(r.fence == token + 1 for r in results)


async def test_append_if_unchanged_needs_the_observed_token_and_stamps_nothing(
    storage: Storage,
) -> None:
    token = await storage.events.acquire_fence("e")
    written = await storage.events.append_if_unchanged(
        "e", [NewEvent("EXECUTION_RECOVERED")], expected_sequence=0, observed_fence=token
    )
    assert "fence" not in written[0].metadata
    await storage.events.acquire_fence("e")
    with pytest.raises(StaleFenceError) as caught:
        await storage.events.append_if_unchanged(
            "e", [NewEvent("X")], expected_sequence=1, observed_fence=token
        )
    assert caught.value.current_fence == token + 1
    assert await storage.events.head("e") == 1
    assert await storage.events.acquire_fence("e") == token + 2  # never bumped by it


async def test_append_many_is_all_or_nothing(storage: Storage) -> None:
    await storage.events.append("b", [NewEvent("A")], expected_sequence=0)
    with pytest.raises(SequenceConflictError):
        await storage.events.append_many(
            [
                AppendRequest("a", [NewEvent("A")], 0),
                AppendRequest("b", [NewEvent("B")], 0 + 7),
            ]
        )
    assert await storage.events.head("a") == 0
    token = await storage.events.acquire_fence("b")
    written = await storage.events.append_many(
        [
            AppendRequest("a", [NewEvent("A"), NewEvent("A2")], 0),
            AppendRequest("b", [NewEvent("B")], 1, fence=token),
        ]
    )
    assert [len(w) for w in written] == [2, 1]
    assert written[1][0].fence == token
    with pytest.raises(InvalidInputError):
        await storage.events.append_many(
            [AppendRequest("a", [NewEvent("A")], 2), AppendRequest("a", [NewEvent("A")], 3)]
        )
    assert await storage.events.head("a") == 2


async def test_delete_moves_the_token_so_every_holder_stays_fenced_out(storage: Storage) -> None:
    zombie = await storage.events.acquire_fence("e")
    await storage.events.append("e", [NewEvent("A")], expected_sequence=0, fence=zombie)
    holder = await storage.events.acquire_fence("e")
    assert await storage.events.delete_execution("e") is True
    assert await storage.events.head("e") == 0
    assert await storage.events.list_executions() == ()
    for stale in (zombie, holder):
        with pytest.raises(StaleFenceError) as caught:
            await storage.events.append("e", [NewEvent("A")], expected_sequence=0, fence=stale)
        assert caught.value.current_fence == holder + 1
    await storage.events.append("e", [NewEvent("A")], expected_sequence=0, fence=holder + 1)
    assert await storage.events.delete_execution("never") is False
    assert await storage.events.acquire_fence("never") == 1, "a delete of nothing moved nothing"


async def test_copy_prefix_branches_and_refuses_an_existing_target(storage: Storage) -> None:
    await storage.events.append(
        "src", [NewEvent("S", {"i": i}) for i in range(5)], expected_sequence=0
    )
    assert await storage.events.copy_prefix("src", "dst", through_sequence=2) == 3
    copied = await storage.events.read("dst")
    assert [(e.sequence, e.payload) for e in copied] == [(i, {"i": i}) for i in range(3)]
    assert all(e.execution_id == "dst" for e in copied)
    assert await storage.events.head("dst") == 3
    with pytest.raises(ExecutionAlreadyExistsError):
        await storage.events.copy_prefix("src", "dst", through_sequence=1)
    with pytest.raises(InvalidSequenceError):
        await storage.events.copy_prefix("src", "other", through_sequence=5)
    with pytest.raises(ExecutionNotFoundError):
        await storage.events.copy_prefix("nope", "other", through_sequence=0)
    with pytest.raises(InvalidInputError):
        await storage.events.copy_prefix("src", "src", through_sequence=0)
    assert await storage.events.head("other") == 0


async def test_a_copied_answer_still_answers_the_copied_park(storage: Storage) -> None:
    token = await _park(storage, "p")
    await storage.events.append("p", [NewEvent("EXECUTION_RESUMED")], expected_sequence=2)
    await storage.events.copy_prefix("p", "branch", through_sequence=2)
    assert await storage.events.acquire_fence_if("branch", fence=0, park_seq=1) == FenceStale(0)
    assert token == 1


async def test_truncate_keeps_the_head(storage: Storage) -> None:
    await storage.events.append("e", [NewEvent("S") for _ in range(5)], expected_sequence=0)
    assert await storage.events.truncate_prefix_keeping("e", keep_from_sequence=3) == 3
    assert [e.sequence for e in await storage.events.read("e")] == [3, 4]
    assert await storage.events.head("e") == 5
    assert await storage.events.truncate_prefix_keeping("e", keep_from_sequence=5) == 2
    assert await storage.events.head("e") == 5
    assert await storage.events.list_executions() == ("e",)
    await storage.events.append("e", [NewEvent("S")], expected_sequence=5)
    with pytest.raises(InvalidSequenceError):
        await storage.events.truncate_prefix_keeping("e", keep_from_sequence=7)
    with pytest.raises(ExecutionNotFoundError):
        await storage.events.truncate_prefix_keeping("nope", keep_from_sequence=0)


def _floors(path: Path) -> list[tuple[str, int]]:
    raw = sqlite3.connect(path)
    try:
        return raw.execute("SELECT execution_id, floor FROM loom_logs ORDER BY 1").fetchall()
    finally:
        raw.close()


async def test_an_append_writes_its_events_and_no_floor(storage: Storage, db_path: Path) -> None:
    events = storage.events
    await events.append("e", [NewEvent("S") for _ in range(3)], expected_sequence=0)
    await events.append("e", [NewEvent("S")], expected_sequence=3, fence=None)
    token = await events.acquire_fence("e")
    await events.append("e", [NewEvent("S")], expected_sequence=4, fence=token)
    await events.append_many([AppendRequest("f", [NewEvent("S")], expected_sequence=0)])
    assert (await events.head("e"), await events.head("f")) == (5, 1)
    assert _floors(db_path) == []
    # A truncation and a copy write the floor that keeps the head where events may not.
    await events.truncate_prefix_keeping("e", keep_from_sequence=5)
    await events.copy_prefix("f", "g", through_sequence=0)
    assert _floors(db_path) == [("e", 5), ("g", 1)]
    assert (await events.head("e"), await events.head("g")) == (5, 1)


async def test_logs_with_events_and_logs_with_only_a_floor_are_listed_together(
    storage: Storage,
) -> None:
    events = storage.events
    for execution_id in ("a", "b", "c", "d", "e"):
        await events.append(execution_id, [NewEvent("S"), NewEvent("S")], expected_sequence=0)
    for execution_id in ("b", "d"):  # only their floors are left
        await events.truncate_prefix_keeping(execution_id, keep_from_sequence=2)
    await events.truncate_prefix_keeping("c", keep_from_sequence=1)  # events and a floor
    assert await events.list_executions() == ("a", "b", "c", "d", "e")
    pages, after = [], None
    while page := await events.list_executions(after=after, limit=2):
        pages.append(page)
        after = page[-1]
    assert pages == [("a", "b"), ("c", "d"), ("e",)]
    assert await events.list_executions(after="b", limit=1) == ("c",)
    assert await events.list_executions(after="c", limit=1) == ("d",)
    assert await events.delete_execution("b") is True  # a floor alone is a log
    assert await events.delete_execution("a") is True
    assert await events.delete_execution("a") is False
    assert await events.list_executions() == ("c", "d", "e")
    assert await events.head("b") == 0


async def test_concurrent_appends_share_commits_but_keep_their_own_results(
    storage: Storage,
) -> None:
    await storage.events.append("taken", [NewEvent("A")], expected_sequence=0)
    token = await storage.events.acquire_fence("fenced")
    await storage.events.acquire_fence("fenced")

    async def attempt(i: int) -> object:
        try:
            if i % 10 == 3:
                return await storage.events.append("taken", [NewEvent("B")], expected_sequence=0)
            if i % 10 == 7:
                return await storage.events.append(
                    "fenced", [NewEvent("B")], expected_sequence=0, fence=token
                )
            return await storage.events.append(f"e{i}", [NewEvent("A")] * 3, expected_sequence=0)
        except Exception as exc:
            return exc

    outcomes = await asyncio.gather(*(attempt(i) for i in range(100)))
    for i, outcome in enumerate(outcomes):
        if i % 10 == 3:
            assert isinstance(outcome, ExecutionAlreadyExistsError)
        elif i % 10 == 7:
            assert isinstance(outcome, StaleFenceError)
        else:
            assert isinstance(outcome, tuple)
            assert len(outcome) == 3
            assert all(isinstance(e, Event) for e in outcome)
    assert await storage.events.head("taken") == 1
    assert await storage.events.head("fenced") == 0
    assert len(await storage.events.list_executions(limit=1000)) == 81


async def test_subscribe_delivers_existing_then_live_events(storage: Storage) -> None:
    await storage.events.append("e", [NewEvent("A"), NewEvent("B")], expected_sequence=0)
    seen: list[str] = []

    async def follow() -> None:
        async for event in storage.events.subscribe("e", from_sequence=1):
            seen.append(event.kind)
            if len(seen) == 3:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    await storage.events.append("e", [NewEvent("C"), NewEvent("D")], expected_sequence=2)
    await asyncio.wait_for(task, timeout=10)
    assert seen == ["B", "C", "D"]


async def test_subscribe_validates_eagerly(storage: Storage) -> None:
    with pytest.raises(InvalidSequenceError):
        storage.events.subscribe("e", from_sequence=-1)
    with pytest.raises(InvalidInputError):
        storage.events.subscribe("")


async def test_closing_the_storage_ends_subscriptions(db_url: str) -> None:
    storage = await open_storage(db_url)
    received: list[Event] = []

    async def follow() -> None:
        async for event in storage.events.subscribe("quiet"):
            received.append(event)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    await storage.close()
    await asyncio.wait_for(task, timeout=10)
    assert received == []


async def test_a_subscriber_leaving_does_not_deafen_another_on_the_same_log(
    storage: Storage,
) -> None:
    quitter = storage.events.subscribe("e")
    stayer: list[str] = []

    async def stay() -> None:
        async for event in storage.events.subscribe("e"):
            stayer.append(event.kind)
            if len(stayer) == 2:
                return

    task = asyncio.create_task(stay())
    first = asyncio.ensure_future(anext(quitter))
    await asyncio.sleep(0.05)  # both are waiting on the empty log now
    await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
    assert (await asyncio.wait_for(first, timeout=10)).kind == "A"
    await quitter.aclose()  # type: ignore[attr-defined]
    await storage.events.append("e", [NewEvent("B")], expected_sequence=1)
    await asyncio.wait_for(task, timeout=10)
    assert stayer == ["A", "B"]


async def test_a_failed_look_for_other_processes_commits_does_not_deafen_subscribers(
    db_url: str, storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poller's read of ``data_version`` fails once (a disk I/O error, a lock held
    past busy_timeout_ms): it goes on polling, so a commit by another storage on the
    file still reaches the subscriber waiting on its log."""
    failed = asyncio.Event()
    real = subscribe._data_version

    def fails_once(raw: sqlite3.Connection) -> int:
        if not failed.is_set():
            failed.set()
            raise sqlite3.OperationalError("disk I/O error")
        return real(raw)

    monkeypatch.setattr(subscribe, "_data_version", fails_once)
    received: list[Event] = []

    async def follow() -> None:
        async for event in storage.events.subscribe("shared"):
            received.append(event)
            return

    task = asyncio.create_task(follow())
    await asyncio.wait_for(failed.wait(), timeout=30)
    async with open_storage(db_url) as other:
        await other.events.append(
            "shared", [NewEvent("order.shipped", {"from": "other"})], expected_sequence=0
        )
    # A guard against hanging the run, not a measure: a poller that ended at the failure
    # would leave the subscriber waiting for good.
    await asyncio.wait_for(task, timeout=30)
    assert [(e.kind, e.payload) for e in received] == [("order.shipped", {"from": "other"})]


async def test_the_largest_positions_sqlite_stores_are_accepted(storage: Storage) -> None:
    # 2**63 - 1 is the largest value the kernel accepts and the largest SQLite integer:
    # it reaches the SQL unclamped (one past it is refused by the kernel, see
    # test_sqlite_refusals.py).
    largest = 2**63 - 1
    await storage.events.append("e", [NewEvent("EXECUTION_SUSPENDED")], expected_sequence=0)
    assert await storage.events.read("e", from_sequence=largest) == ()
    assert len(await storage.events.read("e", to_sequence=largest, limit=largest)) == 1
    assert await storage.events.list_executions(limit=largest) == ("e",)
    with pytest.raises(SequenceConflictError):
        await storage.events.append("e", [NewEvent("A")], expected_sequence=largest)
    assert await storage.timers.due(datetime(2030, 1, 1, tzinfo=UTC), limit=largest) == ()


async def test_reads_lists_and_conditional_fences_bind_without_a_warning(db_url: str) -> None:
    # Python 3.12.1 warned at each of these calls that numbered placeholders (?1) bound
    # from a sequence would be an error in 3.14 (3.11 and 3.13.0 did not): the statements'
    # placeholders are named now, bound from a mapping, which every version takes silently.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the store's thread sees this filter too
        async with open_storage(db_url) as storage:
            events = storage.events
            token = await events.acquire_fence("e")
            await events.append("e", [NewEvent("A"), NewEvent("EXECUTION_SUSPENDED")],
                                expected_sequence=0, fence=token)
            assert [e.kind for e in await events.read("e", from_sequence=1, limit=1)] == [
                "EXECUTION_SUSPENDED"
            ]
            assert await events.list_executions(limit=5) == ("e",)
            acquired = await events.acquire_fence_if("e", fence=token, park_seq=1)
            assert isinstance(acquired, FenceAcquired)
