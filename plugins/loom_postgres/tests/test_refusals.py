"""What PostgreSQL refuses, and that a refusal leaves nothing behind, read from the tables
themselves where the API cannot see it (a token-0 fence row is invisible through it):
never-issued tokens, conditional acquires without a log or past the head, refused
conditional appends, 64-bit limits, and every store after close()."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
import pytest

from loom_core import AppendRequest, NewEvent, Storage, TimerRecord
from loom_core.errors import (
    ExecutionNotFoundError,
    FenceNotIssuedError,
    InvalidOptionError,
    InvalidSequenceError,
    SequenceConflictError,
    StaleFenceError,
    StoreClosedError,
)

Opener = Callable[..., Awaitable[Storage]]
Conn = psycopg.AsyncConnection[tuple[Any, ...]]
PARK = [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")]
STEP = [NewEvent("STEP_COMPLETED")]


async def _tables(admin: Conn) -> tuple[list[tuple[Any, ...]], ...]:
    """Every row of the three tables a write can touch."""
    out = []
    for query in (
        "SELECT execution_id, head FROM loom_executions ORDER BY 1",
        "SELECT execution_id, sequence, kind FROM loom_events ORDER BY 1, 2",
        "SELECT execution_id, token FROM loom_fences ORDER BY 1",
    ):
        out.append(list(await (await admin.execute(query)).fetchall()))
    return tuple(out)


async def test_a_token_never_issued_is_refused_on_both_append_paths_and_changes_nothing(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    storage = await open_pg(schema=schema)
    events = storage.events
    assert await events.acquire_fence("x") == 1
    await events.append("x", PARK, expected_sequence=0, fence=1)
    await events.append("y", PARK, expected_sequence=0)
    before = await _tables(admin)
    with pytest.raises(FenceNotIssuedError) as caught:
        await events.append("x", STEP, expected_sequence=2, fence=100)
    assert (caught.value.presented_fence, caught.value.current_fence) == (100, 1)
    with pytest.raises(FenceNotIssuedError) as caught:
        await events.append("y", STEP, expected_sequence=2, fence=1)  # no fence row at all
    assert (caught.value.presented_fence, caught.value.current_fence) == (1, 0)
    with pytest.raises(FenceNotIssuedError) as caught:
        await events.append_many(
            [AppendRequest("y", STEP, 2), AppendRequest("x", STEP, 2, fence=2)]
        )
    assert (caught.value.execution_id, caught.value.current_fence) == ("x", 1)
    # The sequence is judged first, then the fence.
    with pytest.raises(SequenceConflictError):
        await events.append("x", STEP, expected_sequence=1, fence=100)
    # A creation under a token nobody issued leaves no log behind.
    with pytest.raises(FenceNotIssuedError):
        await events.append("z", STEP, expected_sequence=0, fence=3)
    with pytest.raises(FenceNotIssuedError):
        await events.append_many([AppendRequest("z", STEP, 0, fence=3)])
    assert await _tables(admin) == before
    # And later acquires do not make the number acceptable by accident.
    await events.append("x", STEP, expected_sequence=2, fence=1)
    assert await events.acquire_fence("x") == 2
    with pytest.raises(FenceNotIssuedError):
        await events.append("x", STEP, expected_sequence=3, fence=100)


async def test_a_stale_fenced_append_puts_the_head_back(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    # The head row is moved before the token is read (that is the lock order); a refusal
    # must undo it inside the function, on both paths, for a log and for a creation.
    storage = await open_pg(schema=schema)
    events = storage.events
    await events.append("x", PARK, expected_sequence=0)
    assert await events.acquire_fence("x") == 1
    assert await events.acquire_fence("new") == 1  # a token, and no log yet
    before = await _tables(admin)
    for call in (
        lambda: events.append("x", STEP, expected_sequence=2, fence=0),
        lambda: events.append_many([AppendRequest("x", STEP, 2, fence=0)]),
        lambda: events.append("new", STEP, expected_sequence=0, fence=0),
        lambda: events.append_many([AppendRequest("new", STEP, 0, fence=0)]),
    ):
        with pytest.raises(StaleFenceError):
            await call()
        assert await _tables(admin) == before


async def test_acquire_fence_if_refuses_no_log_and_a_park_at_the_head_and_writes_nothing(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    storage = await open_pg(schema=schema)
    events = storage.events
    await events.append("x", PARK, expected_sequence=0)
    before = await _tables(admin)
    with pytest.raises(ExecutionNotFoundError) as missing:
        await events.acquire_fence_if("ghost", fence=0, park_seq=0)
    assert missing.value.execution_id == "ghost"
    for park_seq in (2, 3, 2**63 - 1):
        with pytest.raises(InvalidSequenceError, match=r"at or past the head of 'x' \(2\)"):
            await events.acquire_fence_if("x", fence=0, park_seq=park_seq)
    # A token above the current one is stale (with the current token), not an error.
    stale = await events.acquire_fence_if("x", fence=5, park_seq=1)
    assert (stale.acquired, stale.fence) == (False, 0)
    assert await _tables(admin) == before  # no fence row was created for any of them
    won = await events.acquire_fence_if("x", fence=0, park_seq=1)
    assert (won.acquired, won.fence) == (True, 1)


async def test_a_refused_append_if_unchanged_leaves_no_fence_row(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    storage = await open_pg(schema=schema)
    events = storage.events
    await events.append("x", PARK, expected_sequence=0)
    before = await _tables(admin)
    with pytest.raises(SequenceConflictError):  # an id with no log
        await events.append_if_unchanged("ghost", STEP, expected_sequence=3, observed_fence=0)
    with pytest.raises(SequenceConflictError):  # a moved head
        await events.append_if_unchanged("x", STEP, expected_sequence=1, observed_fence=0)
    with pytest.raises(StaleFenceError):  # a token that is not the current one (0)
        await events.append_if_unchanged("x", STEP, expected_sequence=2, observed_fence=1)
    with pytest.raises(StaleFenceError):  # judged before the sequence
        await events.append_if_unchanged("ghost", STEP, expected_sequence=0, observed_fence=1)
    assert await _tables(admin) == before
    assert (await _tables(admin))[2] == []
    # The one that is accepted needs no row either.
    await events.append_if_unchanged("x", STEP, expected_sequence=2, observed_fence=0)
    assert (await _tables(admin))[2] == []


async def test_limits_past_64_bits_are_refused_before_the_server_is_asked(
    open_pg: Opener,
) -> None:
    storage = await open_pg()
    await storage.events.append("x", STEP, expected_sequence=0)
    for limit in (2**63, 2**64 + 1):
        with pytest.raises(InvalidOptionError):
            await storage.events.read("x", limit=limit)
        with pytest.raises(InvalidOptionError):
            await storage.events.list_executions(limit=limit)
        with pytest.raises(InvalidOptionError):
            await storage.timers.due(datetime.now(UTC), limit=limit)
    assert await storage.events.read("x", limit=2**63 - 1) != ()
    assert await storage.events.list_executions(limit=2**63 - 1) == ("x",)


async def test_every_store_refuses_after_close_with_store_closed_error(open_pg: Opener) -> None:
    storage = await open_pg()
    events, timers, leases = storage.events, storage.timers, storage.leases
    await events.append("x", PARK, expected_sequence=0)
    await storage.close()
    await storage.close()  # twice is harmless
    when = datetime(2030, 1, 1, tzinfo=UTC)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: events.append("x", STEP, expected_sequence=2),
        lambda: events.read("x"),
        lambda: events.head("x"),
        lambda: events.list_executions(),
        lambda: events.acquire_fence("x"),
        lambda: events.acquire_fence_if("x", fence=0, park_seq=1),
        lambda: events.append_if_unchanged("x", STEP, expected_sequence=2, observed_fence=0),
        lambda: events.append_many([AppendRequest("x", STEP, 2)]),
        lambda: events.delete_execution("x"),
        lambda: events.copy_prefix("x", "y", through_sequence=0),
        lambda: events.truncate_prefix_keeping("x", keep_from_sequence=1),
        lambda: events.subscribe("x").__anext__(),
        lambda: cast(Any, events).group_commit.submit(None),  # the committer itself
        lambda: timers.schedule(TimerRecord("x", when)),
        lambda: timers.due(when),
        lambda: timers.pending("x"),
        lambda: timers.complete("x", when),
        lambda: timers.cancel("x"),
        lambda: leases.acquire("k", "me", ttl_seconds=5),
        lambda: leases.renew("k", "me", ttl_seconds=5),
        lambda: leases.release("k", "me"),
        lambda: leases.inspect("k"),
    ]
    for call in calls:
        with pytest.raises(StoreClosedError):
            await call()
