"""What SQLite refuses, and that a refusal leaves the file exactly as it was.

See docs/design.md, "A refused write changes nothing": a fence token presented to an
append above the current one was never issued (:class:`~loom_core.FenceNotIssuedError`;
``acquire_fence_if`` and ``append_if_unchanged`` compare a token they read, so above is
stale there, as the kit pins), ``acquire_fence_if`` refuses a missing log and a park at or
past the head, positions and limits past 64 bits are refused by the kernel's validation
when the method is called, and every store refuses after ``close()`` with
:class:`~loom_core.StoreClosedError`. "Exactly as it was" is checked on the file itself:
every row of every ``loom_`` table, read with the ``sqlite3`` module, is the same before
and after the refusal (a stray fence row would show).
"""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlite_helpers import parked

from loom_core import (
    AppendRequest,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceAcquired,
    FenceNotIssuedError,
    FenceStale,
    InvalidOptionError,
    InvalidSequenceError,
    LoomError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    Storage,
    StoreClosedError,
    TimerRecord,
    open_storage,
)

TABLES = ("loom_logs", "loom_events", "loom_fences", "loom_timers", "loom_leases")
HUGE = 2**63  # one past the largest position (a signed 64-bit integer)


def snapshot(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every Loom table, in a stable order, read past the store."""
    raw = sqlite3.connect(path)
    try:
        # The table names are this module's constants, not values.
        return {
            table: sorted(raw.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            for table in TABLES
        }
    finally:
        raw.close()


Call = Callable[[Storage], Awaitable[object]]

NOT_ISSUED: dict[str, Call] = {
    "append": lambda s: s.events.append("p", [NewEvent("A")], expected_sequence=2, fence=5),
    "append to a new id": lambda s: s.events.append(
        "fresh", [NewEvent("A")], expected_sequence=0, fence=1
    ),
    "append_many": lambda s: s.events.append_many(
        [
            AppendRequest("other", [NewEvent("A")], 0),
            AppendRequest("p", [NewEvent("A")], 2, fence=5),
        ]
    ),
}


@pytest.mark.parametrize("call", sorted(NOT_ISSUED))
async def test_a_token_above_the_current_one_was_never_issued_and_changes_nothing(
    storage: Storage, db_path: Path, call: str
) -> None:
    token = await parked(storage)
    before = snapshot(db_path)
    with pytest.raises(FenceNotIssuedError) as caught:
        await NOT_ISSUED[call](storage)
    expected_current = 0 if "new id" in call else token
    assert (caught.value.presented_fence, caught.value.current_fence) == (
        1 if "new id" in call else 5,
        expected_current,
    )
    assert isinstance(caught.value, InvalidSequenceError)
    assert snapshot(db_path) == before
    # And it stays refused after later acquires that do not reach it.
    assert await storage.events.acquire_fence("p") == token + 1
    with pytest.raises(FenceNotIssuedError):
        await storage.events.append("p", [NewEvent("A")], expected_sequence=2, fence=5)


async def test_the_kit_probe_reads_the_token_and_writes_nothing(
    storage: Storage, db_path: Path
) -> None:
    token = await parked(storage)
    before = snapshot(db_path)
    with pytest.raises(FenceNotIssuedError) as caught:
        await storage.events.append("p", [NewEvent("A")], expected_sequence=2, fence=2**62)
    assert caught.value.current_fence == token
    assert snapshot(db_path) == before


async def test_the_sequence_is_checked_before_the_fence(storage: Storage) -> None:
    await parked(storage)
    with pytest.raises(SequenceConflictError):
        await storage.events.append("p", [NewEvent("A")], expected_sequence=7, fence=5)
    with pytest.raises(ExecutionAlreadyExistsError):
        await storage.events.append("p", [NewEvent("A")], expected_sequence=0, fence=5)
    with pytest.raises(SequenceConflictError):
        await storage.events.append_many([AppendRequest("p", [NewEvent("A")], 7, fence=5)])
    # append_if_unchanged keeps its order: the token first, then the head.
    for observed in (0, 5):
        with pytest.raises(StaleFenceError):
            await storage.events.append_if_unchanged(
                "p", [NewEvent("A")], expected_sequence=7, observed_fence=observed
            )


async def test_a_higher_token_is_stale_for_the_calls_that_compare_one(
    storage: Storage, db_path: Path
) -> None:
    token = await parked(storage)
    before = snapshot(db_path)
    assert await storage.events.acquire_fence_if("p", fence=token + 4, park_seq=1) == FenceStale(
        token
    )
    with pytest.raises(StaleFenceError) as caught:
        await storage.events.append_if_unchanged(
            "p", [NewEvent("A")], expected_sequence=2, observed_fence=token + 4
        )
    assert caught.value.current_fence == token
    assert snapshot(db_path) == before


async def test_acquire_fence_if_on_an_execution_with_no_log_is_not_found(
    storage: Storage, db_path: Path
) -> None:
    before = snapshot(db_path)
    for fence in (0, 3):  # the missing log is checked first, whatever the token
        with pytest.raises(ExecutionNotFoundError) as caught:
            await storage.events.acquire_fence_if("ghost", fence=fence, park_seq=0)
        assert caught.value.execution_id == "ghost"
    assert snapshot(db_path) == before  # no fence row for the ghost


async def test_acquire_fence_if_refuses_a_park_at_or_past_the_head(
    storage: Storage, db_path: Path
) -> None:
    token = await parked(storage)  # head 2
    before = snapshot(db_path)
    for park_seq in (2, 3, 2**63 - 1):
        with pytest.raises(InvalidSequenceError, match=r"at or past the head of 'p' \(2\)"):
            await storage.events.acquire_fence_if("p", fence=token, park_seq=park_seq)
    # The park is checked before the token.
    with pytest.raises(InvalidSequenceError):
        await storage.events.acquire_fence_if("p", fence=token + 9, park_seq=2)
    assert snapshot(db_path) == before


async def test_a_stale_conditional_acquire_moves_nothing(storage: Storage, db_path: Path) -> None:
    token = await parked(storage)
    await storage.events.acquire_fence("p")
    before = snapshot(db_path)
    result = await storage.events.acquire_fence_if("p", fence=token, park_seq=1)
    assert result.fence == token + 1
    assert snapshot(db_path) == before


async def test_a_never_fenced_park_expects_token_zero(storage: Storage, db_path: Path) -> None:
    await storage.events.append("p", [NewEvent("EXECUTION_SUSPENDED")], expected_sequence=0)
    before = snapshot(db_path)
    assert await storage.events.acquire_fence_if("p", fence=1, park_seq=0) == FenceStale(0)
    assert snapshot(db_path) == before  # no fence row
    assert await storage.events.acquire_fence_if("p", fence=0, park_seq=0) == FenceAcquired(1)


OUT_OF_RANGE: dict[str, Callable[[Storage], object]] = {
    "read from_sequence": lambda s: s.events.read("e", from_sequence=HUGE),
    "read to_sequence": lambda s: s.events.read("e", to_sequence=HUGE),
    "read limit": lambda s: s.events.read("e", limit=HUGE),
    "list_executions limit": lambda s: s.events.list_executions(limit=HUGE),
    "append expected_sequence": lambda s: s.events.append(
        "e", [NewEvent("A")], expected_sequence=HUGE
    ),
    "append fence": lambda s: s.events.append(
        "e", [NewEvent("A")], expected_sequence=1, fence=HUGE
    ),
    "append_many fence": lambda s: s.events.append_many(
        [AppendRequest("e", [NewEvent("A")], 1, fence=HUGE)]
    ),
    "append_if_unchanged observed_fence": lambda s: s.events.append_if_unchanged(
        "e", [NewEvent("A")], expected_sequence=1, observed_fence=HUGE
    ),
    "acquire_fence_if fence": lambda s: s.events.acquire_fence_if("e", fence=HUGE, park_seq=0),
    "acquire_fence_if park_seq": lambda s: s.events.acquire_fence_if("e", fence=0, park_seq=HUGE),
    "copy_prefix through_sequence": lambda s: s.events.copy_prefix(
        "e", "f", through_sequence=HUGE
    ),
    "truncate keep_from_sequence": lambda s: s.events.truncate_prefix_keeping(
        "e", keep_from_sequence=HUGE
    ),
    "subscribe from_sequence": lambda s: s.events.subscribe("e", from_sequence=HUGE),
    "timers due limit": lambda s: s.timers.due(datetime(2030, 1, 1, tzinfo=UTC), limit=HUGE),
}


async def _called(call: Callable[[Storage], object], storage: Storage) -> None:
    outcome = call(storage)
    if inspect.isawaitable(outcome):
        await outcome


@pytest.mark.parametrize("call", sorted(OUT_OF_RANGE))
async def test_a_position_or_limit_past_64_bits_is_refused_when_called(
    storage: Storage, db_path: Path, call: str
) -> None:
    await storage.events.append("e", [NewEvent("EXECUTION_SUSPENDED")], expected_sequence=0)
    before = snapshot(db_path)
    with pytest.raises((InvalidSequenceError, InvalidOptionError), match="2\\*\\*63 - 1"):
        # subscribe is refused by the call itself, the coroutines when awaited: either
        # way before the store is touched.
        await _called(OUT_OF_RANGE[call], storage)
    assert snapshot(db_path) == before


CLOSED: dict[str, Call] = {
    "append": lambda s: s.events.append("e", [NewEvent("A")], expected_sequence=1),
    "read": lambda s: s.events.read("e"),
    "head": lambda s: s.events.head("e"),
    "list_executions": lambda s: s.events.list_executions(),
    "acquire_fence": lambda s: s.events.acquire_fence("e"),
    "acquire_fence_if": lambda s: s.events.acquire_fence_if("e", fence=0, park_seq=0),
    "append_if_unchanged": lambda s: s.events.append_if_unchanged(
        "e", [NewEvent("A")], expected_sequence=1, observed_fence=0
    ),
    "append_many": lambda s: s.events.append_many([AppendRequest("e", [NewEvent("A")], 1)]),
    "delete_execution": lambda s: s.events.delete_execution("e"),
    "copy_prefix": lambda s: s.events.copy_prefix("e", "f", through_sequence=0),
    "truncate_prefix_keeping": lambda s: s.events.truncate_prefix_keeping(
        "e", keep_from_sequence=0
    ),
    "subscribe": lambda s: anext(s.events.subscribe("e")),
    "timers.schedule": lambda s: s.timers.schedule(
        TimerRecord("e", datetime(2030, 1, 1, tzinfo=UTC))
    ),
    "timers.due": lambda s: s.timers.due(datetime(2030, 1, 1, tzinfo=UTC)),
    "timers.pending": lambda s: s.timers.pending("e"),
    "timers.complete": lambda s: s.timers.complete("e", datetime(2030, 1, 1, tzinfo=UTC)),
    "timers.cancel": lambda s: s.timers.cancel("e"),
    "leases.acquire": lambda s: s.leases.acquire("k", "h", ttl_seconds=5),
    "leases.renew": lambda s: s.leases.renew("k", "h", ttl_seconds=5),
    "leases.release": lambda s: s.leases.release("k", "h"),
    "leases.inspect": lambda s: s.leases.inspect("k"),
}


@pytest.mark.parametrize("call", sorted(CLOSED))
async def test_every_store_refuses_after_close_with_the_kernel_error(
    db_url: str, db_path: Path, call: str
) -> None:
    storage = await open_storage(db_url)
    await storage.events.append("e", [NewEvent("EXECUTION_SUSPENDED")], expected_sequence=0)
    await storage.close()
    before = snapshot(db_path)
    with pytest.raises(StoreClosedError) as caught:
        await CLOSED[call](storage)
    assert isinstance(caught.value, LoomError)
    await storage.close()  # twice is harmless
    assert snapshot(db_path) == before
