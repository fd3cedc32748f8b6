"""ADR 0118 D1: an answering append racing ``acquire_fence_if``.

The invariant: "the append lands and the acquire is stale" or "the acquire wins and the
append is StaleFenceError", never both succeeding. Each race runs 300 times per append
path (single append, append_many). The same races with the FOR SHARE read switched off
(``loom_postgres.testing``) must show the violation, which proves the tests can catch it.

The permutation test drives the SQL the way PostgreSQL's isolation tester does: two
sessions, every interleaving of (BEGIN, statement, COMMIT) steps, a blocked step detected
with ``pg_isolation_test_session_is_blocked``; every valid ordering must hold the
invariant (and, without the lock, one of them must break it).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import psycopg
import pytest
from loom_postgres.events import MANY_LOCKING, MANY_PLAIN
from loom_postgres.schema import ANSWERING, KERNEL
from loom_postgres.testing import disable_answering_lock

from loom_core import AppendRequest, NewEvent, Storage
from loom_core.errors import StaleFenceError

Opener = Callable[..., Awaitable[Storage]]
Path = Literal["append", "append_many"]
RUNS = 300

PARK = [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")]


async def _race(appender: Storage, acquirer: Storage, path: Path, runs: int) -> Counter[str]:
    """Race ``runs`` times; count outcomes as 'append'/'acquire'/'both'/'neither'."""
    outcomes: Counter[str] = Counter()
    for i in range(runs):
        eid = f"race-{path}-{i}-{uuid.uuid4().hex[:6]}"
        await appender.events.append(eid, PARK, expected_sequence=0)

        async def answer(eid: str = eid, run: int = i) -> bool:
            resume = [NewEvent("EXECUTION_RESUMED", {"run": run})]
            try:
                if path == "append":
                    await appender.events.append(eid, resume, expected_sequence=2, fence=0)
                else:
                    await appender.events.append_many(
                        [
                            AppendRequest(eid, resume, 2, fence=0),
                            AppendRequest(f"{eid}-sibling", [NewEvent("app.note")], 0),
                        ]
                    )
            except StaleFenceError:
                return False
            return True

        async def acquire(eid: str = eid) -> bool:
            result = await acquirer.events.acquire_fence_if(eid, fence=0, park_seq=1)
            return result.acquired

        appended, acquired = await asyncio.gather(answer(), acquire())
        # What a user would see afterwards agrees with what each side was told.
        log = await acquirer.events.read(eid)
        assert (len(log) == 3) == appended
        outcomes[
            "both" if appended and acquired
            else "append" if appended
            else "acquire" if acquired
            else "neither"
        ] += 1
    return outcomes


@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_answering_append_and_conditional_acquire_never_both_win(
    open_pg: Opener, schema: str, path: Path
) -> None:
    node_a = await open_pg(schema=schema)
    node_b = await open_pg(schema=schema)
    outcomes = await _race(node_a, node_b, path, RUNS)
    assert outcomes["both"] == 0, outcomes
    assert outcomes["neither"] == 0, outcomes
    assert outcomes["append"] + outcomes["acquire"] == RUNS


@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_without_the_for_share_read_the_race_is_lost(
    open_pg: Opener, schema: str, path: Path
) -> None:
    node_a = await open_pg(schema=schema)
    node_b = await open_pg(schema=schema)
    disable_answering_lock(node_a.events)
    outcomes = await _race(node_a, node_b, path, RUNS)
    assert outcomes["both"] > 0, f"the negative control never hit the window: {outcomes}"


# -- isolation-tester style permutations ---------------------------------------------------

Step = tuple[str, str]  # (session, step name)
APPEND_STEPS: tuple[Step, ...] = (("a", "begin"), ("a", "append"), ("a", "commit"))
ACQUIRE_STEPS: tuple[Step, ...] = (("c", "begin"), ("c", "acquire"), ("c", "commit"))


def interleavings() -> list[tuple[Step, ...]]:
    """Every ordering of the six steps that keeps each session's own order (20)."""
    out = []
    for positions in itertools.combinations(range(6), 3):
        a, c = iter(APPEND_STEPS), iter(ACQUIRE_STEPS)
        out.append(tuple(next(a) if i in positions else next(c) for i in range(6)))
    return out


def _append_statement(path: Path, eid: str, lock: bool) -> tuple[str, Any]:
    if path == "append":
        return (
            'SELECT o_status FROM loom_batch(%s::"char"[], %s::text[], %s::bigint[], '
            "%s::bigint[], %s::boolean[], %s::boolean[], %s::integer[], %s::text[], "
            "%s::text[], %s::text[], %s::text[], %s::bigint, %s::text[], %s::text[], "
            "%s::float8)",
            (["a"], [eid], [2], [0], [lock], [False], [1], ["EXECUTION_RESUMED"], ["null"],
             ['{"fence":0}'], [None], 1, ANSWERING, KERNEL, 0.5),
        )
    return (
        MANY_LOCKING if lock else MANY_PLAIN,
        {"ids": [eid], "expected": [2], "fences": [0], "counts": [1], "parks": [False],
         "channels": [None], "ev_req": [1], "ev_off": [0], "kinds": ["EXECUTION_RESUMED"],
         "payloads": ["null"], "metadata": ['{"fence":0}'], "writer": 1,
         "notify_limit": 0.5},
    )


async def _run_permutation(
    url: str, schema: str, path: Path, order: tuple[Step, ...], lock: bool, setup: Storage
) -> tuple[bool, bool] | None:
    """Play ``order``; None if it is invalid (a step of a blocked session)."""
    eid = f"perm-{uuid.uuid4().hex[:10]}"
    await setup.events.append(eid, PARK, expected_sequence=0)
    sessions = {
        name: await psycopg.AsyncConnection.connect(url, autocommit=True) for name in "ac"
    }
    monitor = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        for conn in sessions.values():
            await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        pids = {name: conn.info.backend_pid for name, conn in sessions.items()}
        results: dict[str, Any] = {}
        blocked: dict[str, asyncio.Task[Any]] = {}

        async def run(session: str, step: str) -> Any:
            conn = sessions[session]
            if step in ("begin", "commit"):
                await conn.execute(step.upper())
                return None
            if step == "append":
                query, params = _append_statement(path, eid, lock)
                row = await (await conn.execute(query, params)).fetchone()
                assert row is not None
                return int(row[0]) if path == "append" else int(row[1])
            row = await (
                await conn.execute(
                    "SELECT o_acquired FROM loom_acquire_fence_if(%s, 0, 1, %s, %s)",
                    (eid, ANSWERING, KERNEL),
                )
            ).fetchone()
            assert row is not None
            return bool(row[0])

        async def is_blocked(session: str) -> bool:
            other = pids["c" if session == "a" else "a"]
            row = await (
                await monitor.execute(
                    "SELECT pg_isolation_test_session_is_blocked(%s, %s)",
                    (pids[session], [other]),
                )
            ).fetchone()
            return bool(row and row[0])

        for session, step in order:
            for name, task in list(blocked.items()):
                if task.done():
                    del blocked[name]
            if session in blocked:
                for task in blocked.values():
                    task.cancel()
                return None  # the isolation tester calls this an invalid permutation
            task = asyncio.create_task(run(session, step))
            while not task.done():
                if await is_blocked(session):
                    blocked[session] = task
                    break
                await asyncio.sleep(0.002)
            if task.done():
                results[f"{session}.{step}"] = task.result()
            else:
                results[f"{session}.{step}"] = task
        for key, value in list(results.items()):
            if isinstance(value, asyncio.Task):
                results[key] = await asyncio.wait_for(value, 10)
        appended = results["a.append"] == 0
        acquired = bool(results["c.acquire"])
        return appended, acquired
    finally:
        for conn in (*sessions.values(), monitor):
            await conn.close()


@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_every_valid_permutation_keeps_append_and_acquire_exclusive(
    open_pg: Opener, pg_url: str, schema: str, path: Path
) -> None:
    setup = await open_pg(schema=schema)
    valid = 0
    for order in interleavings():
        outcome = await _run_permutation(pg_url, schema, path, order, True, setup)
        if outcome is None:
            continue
        valid += 1
        appended, acquired = outcome
        assert appended != acquired, f"{order}: appended={appended}, acquired={acquired}"
    assert valid >= 10


@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_without_the_lock_some_permutation_lets_both_win(
    open_pg: Opener, pg_url: str, schema: str, path: Path
) -> None:
    setup = await open_pg(schema=schema)
    broken = []
    for order in interleavings():
        outcome = await _run_permutation(pg_url, schema, path, order, False, setup)
        if outcome == (True, True):
            broken.append(order)
    assert broken, "no interleaving broke the invariant without the FOR SHARE read"
