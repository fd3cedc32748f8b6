"""One write alone (append, append_if_unchanged, acquire_fence) goes through
``loom_write_one`` (scalar parameters), a group through ``loom_batch``: both judge every
write alike (sequence, fence, never-issued tokens, creation, append_if_unchanged's
token-first rule, the token an acquire returns), and a refusal changes nothing on either.
Read from the functions' own answers and the tables, and through the store."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from loom_postgres import PostgresEventStore
from loom_postgres.events import BATCH, WRITE_ONE
from loom_postgres.schema import ANSWERING_LITERAL, KERNEL_LITERAL

from loom_core import NewEvent, Storage
from loom_core.errors import (
    ExecutionAlreadyExistsError,
    FenceNotIssuedError,
    SequenceConflictError,
    StaleFenceError,
    StorageError,
)

Opener = Callable[..., Awaitable[Storage]]
Conn = psycopg.AsyncConnection[tuple[Any, ...]]
PARK = [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")]
STEP = [NewEvent("STEP_COMPLETED", {"n": 1.0e-5, "big": 1e300, "z": 1, "a": [1, "\u00e9"]})]

# (op, fence presented): an unfenced append, a fenced one, append_if_unchanged, and
# acquire_fence (no events, no fence).
WRITES = [("a", None), ("a", 0), ("a", 1), ("a", 2), ("u", 0), ("u", 1), ("u", 2), ("f", None)]
TOKENS = [None, 0, 1]  # no fence row, a token-0 row, a real token
HEADS = [None, 2]  # no log, a log of two events
SEQS = [0, 2, 3]
KIND, PAYLOAD, METADATA = "STEP_COMPLETED", '{"b":1e300,"a":[1,2]}', '{"fence":1}'


async def _setup(admin: Conn, eid: str, head: int | None, token: int | None) -> None:
    if head is not None:
        await admin.execute(
            "INSERT INTO loom_executions (execution_id, head) VALUES (%s, %s)", (eid, head)
        )
    if token is not None:
        await admin.execute(
            "INSERT INTO loom_fences (execution_id, token) VALUES (%s, %s)", (eid, token)
        )


async def _state(admin: Conn, eid: str) -> tuple[list[tuple[Any, ...]], ...]:
    out = []
    for query in (
        "SELECT head FROM loom_executions WHERE execution_id = %s",
        "SELECT sequence, kind, payload::text, metadata::text, writer FROM loom_events "
        "WHERE execution_id = %s ORDER BY sequence",
        "SELECT token FROM loom_fences WHERE execution_id = %s",
    ):
        out.append(list(await (await admin.execute(query, (eid,))).fetchall()))
    return tuple(out)


async def _single(admin: Conn, op: str, eid: str, seq: int, fence: int | None) -> Any:
    if op == "f":  # as the store sends it: no events, no channel
        params: tuple[Any, ...] = (op, eid, 0, None, 0, "[]", None, 7, 0.5)
    else:
        events = f'[["{KIND}",{PAYLOAD},{METADATA}]]'
        params = (op, eid, seq, fence, 1, events, "chan", 7, 0.5)
    return await (await admin.execute(WRITE_ONE, params)).fetchone()


async def _batched(admin: Conn, op: str, eid: str, seq: int, fence: int | None) -> Any:
    if op == "f":
        params: tuple[Any, ...] = (["f"], [eid], [0], [None], [0], [], [], [], [None], 7,
                                   ANSWERING_LITERAL, KERNEL_LITERAL, 0.5)
    else:
        params = ([op], [eid], [seq], [fence], [1], [KIND], [PAYLOAD], [METADATA], ["chan"],
                  7, ANSWERING_LITERAL, KERNEL_LITERAL, 0.5)
    row = await (await admin.execute(BATCH, params)).fetchone()
    return row


async def test_loom_write_one_and_loom_batch_judge_every_write_alike(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    await open_pg(schema=schema)  # creates the schema
    cases = [
        case for case in itertools.product(WRITES, TOKENS, HEADS, SEQS)
        if case[0][0] != "f" or case[3] == 0  # an acquire has no sequence
    ]
    statuses = set()
    tokens = set()
    for (op, fence), token, head, seq in cases:
        results = []
        for run in (_single, _batched):
            eid = f"eq-{uuid.uuid4().hex[:10]}"
            await _setup(admin, eid, head, token)
            before = await _state(admin, eid)
            status, o_head, o_token, at, notified = await run(admin, op, eid, seq, fence)
            after = await _state(admin, eid)
            if status != 0:
                assert after == before, (run.__name__, op, fence, token, head, seq)
            results.append((status, o_head, o_token, at is None, notified,
                            after[0], [row[:4] for row in after[1]], after[2]))
        statuses.add(results[0][0])
        if op == "f":
            tokens.add(results[0][2])
        assert results[0] == results[1], ((op, fence, token, head, seq), results)
    # Every outcome the functions know for an append was reached, and acquires bumped
    # from no row, a token-0 row and a real token.
    assert statuses == {0, 1, 2, 3, 6}
    assert tokens == {1, 2}


async def test_loom_write_one_stores_the_payload_text_exactly_as_sent(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    await open_pg(schema=schema)
    await _single(admin, "a", "exact", 0, None)
    rows = await (
        await admin.execute(
            "SELECT kind, payload::text, metadata::text FROM loom_events "
            "WHERE execution_id = 'exact'"
        )
    ).fetchall()
    assert rows == [(KIND, PAYLOAD, METADATA)]


async def test_loom_write_one_refuses_repeatable_read_and_writes_nothing(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    await open_pg(schema=schema)
    await admin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    with pytest.raises(psycopg.Error, match="only under READ COMMITTED") as caught:
        await _single(admin, "a", "rr", 0, None)
    assert caught.value.sqlstate == "LM001"
    await admin.execute("ROLLBACK")
    assert await _state(admin, "rr") == ([], [], [])


async def test_a_lone_write_does_not_need_loom_batch(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    # Without loom_batch, only the single path can still write: a lone append, a lone
    # append_if_unchanged, a lone acquire_fence and the refusals all go through
    # loom_write_one; acquire_fence_if is the one write that still needs loom_batch.
    storage = await open_pg(schema=schema)
    events = storage.events
    await admin.execute("ALTER FUNCTION loom_batch RENAME TO loom_batch_away")
    try:
        written = await events.append("x", PARK, expected_sequence=0)
        assert [e.sequence for e in written] == [0, 1]
        await events.append_if_unchanged("x", STEP, expected_sequence=2, observed_fence=0)
        with pytest.raises(SequenceConflictError) as conflict:
            await events.append("x", STEP, expected_sequence=1)
        assert conflict.value.actual_head == 3
        with pytest.raises(ExecutionAlreadyExistsError):
            await events.append("x", STEP, expected_sequence=0)
        with pytest.raises(FenceNotIssuedError):
            await events.append("x", STEP, expected_sequence=3, fence=4)
        assert await events.acquire_fence("x") == 1
        with pytest.raises(StaleFenceError) as stale:
            await events.append("x", STEP, expected_sequence=3, fence=0)
        assert stale.value.current_fence == 1
        await events.append("x", STEP, expected_sequence=3, fence=1)
        with pytest.raises(StorageError, match="loom_batch"):
            await events.acquire_fence_if("x", fence=1, park_seq=1)
    finally:
        await admin.execute("ALTER FUNCTION loom_batch_away RENAME TO loom_batch")
    assert [e.payload for e in await events.read("x", from_sequence=2)] == [STEP[0].payload] * 2
    assert [e.metadata for e in await events.read("x", from_sequence=3)] == [{"fence": 1}]


async def test_lone_and_grouped_appends_are_refused_alike_through_the_store(
    open_pg: Opener, schema: str, admin: Conn
) -> None:
    # One batch in flight at a time: the first call leaves alone (loom_write_one), the
    # others queue behind it and leave together (loom_batch).
    storage = await open_pg(schema=schema, max_inflight_batches=1)
    events = storage.events
    assert isinstance(events, PostgresEventStore)
    for eid in ("one", "many"):
        await events.append(eid, PARK, expected_sequence=0)
        assert await events.acquire_fence(eid) == 1

    def calls(eid: str) -> list[Awaitable[object]]:
        return [
            events.append(eid, STEP, expected_sequence=5),
            events.append(eid, STEP, expected_sequence=0),
            events.append(eid, STEP, expected_sequence=2, fence=0),
            events.append(eid, STEP, expected_sequence=2, fence=9),
            events.append_if_unchanged(eid, STEP, expected_sequence=2, observed_fence=0),
            events.append_if_unchanged(eid, STEP, expected_sequence=7, observed_fence=0),
        ]

    def seen(result: object) -> tuple[object, ...]:
        assert isinstance(result, BaseException)
        return (type(result), *(getattr(result, name, None) for name in
                                ("actual_head", "presented_fence", "current_fence")))

    before = await _state(admin, "one"), await _state(admin, "many")
    lone: list[object] = []
    for call in calls("one"):
        batches = events.group_commit.batches
        lone.extend(await asyncio.gather(call, return_exceptions=True))
        assert events.group_commit.batches == batches + 1
    batches = events.group_commit.batches
    grouped = await asyncio.gather(
        events.append("opener", PARK, expected_sequence=0), *calls("many"),
        return_exceptions=True,
    )
    assert events.group_commit.batches == batches + 2  # the opener, then the six together
    assert [seen(r) for r in lone] == [seen(r) for r in grouped[1:]]
    assert [seen(r)[0] for r in lone] == [
        SequenceConflictError, ExecutionAlreadyExistsError, StaleFenceError,
        FenceNotIssuedError, StaleFenceError, StaleFenceError,
    ]
    assert (await _state(admin, "one"), await _state(admin, "many")) == before
