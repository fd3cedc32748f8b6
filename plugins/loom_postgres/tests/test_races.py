"""The conditional acquire on PostgreSQL: an answering append racing ``acquire_fence_if``
(see docs/design.md, "How PostgreSQL orders the writers of an execution").

The invariant: "the answer lands and the acquire is stale" or "the acquire wins and the
answer is StaleFenceError", never both, for every park: with a fence row, with a token-0
row (as older versions wrote for parks), or with none (parks from before those rows, or
a row removed). No test here depends on the scheduler or on timing:

* Forced interleavings through the store. A third session holds the execution's head
  row; the test starts one side, waits until PostgreSQL reports it blocked, starts the
  other, waits until it is blocked (or done), then lets go. The two sides then meet in a
  known order, so the winner is known too. The negative control runs the unconditional
  ``acquire_fence`` in the same interleaving: the answer lands and the token moves, the
  double win the conditional acquire exists to refuse, so the harness sees one.
* Permutations on the SQL, the way PostgreSQL's isolation tester drives them: three
  sessions (the answering append, the conditional acquire, a third session holding the
  head row), every interleaving of their steps, a blocked step detected with
  ``pg_isolation_test_session_is_blocked``, under READ COMMITTED and under a server whose
  default is REPEATABLE READ. Every valid ordering keeps the invariant; the negative
  controls each take one element out of the protocol (the acquire's head-row lock, the
  append's reading of the token after its head-row lock, append_many's fresh snapshot for
  the token) and some ordering then breaks it.
* Free races, left to the scheduler, as a smoke test: they only ever assert the
  invariant, never that the window was hit.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
import pytest
from loom_conformance.postgres import PostgresServer
from loom_postgres.events import MANY, WRITE_ONE
from loom_postgres.schema import ANSWERING, KERNEL
from psycopg import sql

from loom_core import AppendRequest, NewEvent, Storage, open_storage
from loom_core.errors import StaleFenceError

Opener = Callable[..., Awaitable[Storage]]
Conn = psycopg.AsyncConnection[tuple[Any, ...]]
Path = Literal["append", "append_many"]
FenceRow = Literal["none", "token-0", "acquired"]
RUNS = 300
# A liveness guard only: a forced step that never blocks nor finishes fails the test
# instead of hanging it. Nothing is asserted about how long anything takes.
GUARD = 60.0

PARK = [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")]
RESUME = [NewEvent("EXECUTION_RESUMED")]


async def _connect(url: str, schema: str) -> Conn:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
    return conn


async def _park(
    storage: Storage, admin: Conn, eid: str, row: FenceRow
) -> int:
    """Park ``eid`` with the fence row in the state ``row``; returns the park's token."""
    token = 0
    if row == "acquired":
        token = await storage.events.acquire_fence(eid)
    await storage.events.append(eid, PARK, expected_sequence=0, fence=token or None)
    if row == "none":
        # Whatever the park wrote (an older version wrote a token-0 row) goes again.
        await admin.execute("DELETE FROM loom_fences WHERE execution_id = %s", (eid,))
    elif row == "token-0":
        await admin.execute(
            "INSERT INTO loom_fences (execution_id, token) VALUES (%s, 0) "
            "ON CONFLICT DO NOTHING",
            (eid,),
        )
    return token


async def _answer(storage: Storage, eid: str, path: Path, fence: int) -> bool:
    """The answering append on ``path``: True if it landed, False if fenced out."""
    try:
        if path == "append":
            await storage.events.append(eid, RESUME, expected_sequence=2, fence=fence)
        else:
            await storage.events.append_many(
                [
                    AppendRequest(eid, RESUME, 2, fence=fence),
                    AppendRequest(f"{eid}-sibling", [NewEvent("app.note")], 0),
                ]
            )
    except StaleFenceError:
        return False
    return True


# -- forced interleavings through the store ------------------------------------------------


async def _blocked(monitor: Conn) -> int:
    """Sessions of this database waiting for a lock another session holds."""
    row = await (
        await monitor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND cardinality(pg_blocking_pids(pid)) > 0"
        )
    ).fetchone()
    assert row is not None
    return int(row[0])


async def _until_blocked(monitor: Conn, count: int, task: asyncio.Task[Any]) -> None:
    """Wait until ``count`` sessions are blocked, or ``task`` is done."""

    async def poll() -> None:
        while not task.done():
            if await _blocked(monitor) >= count:
                return
            await asyncio.sleep(0.002)

    await asyncio.wait_for(poll(), GUARD)


@dataclass
class Forced:
    appended: bool
    acquired: bool
    token: int


async def _forced(
    appender: Storage,
    acquirer: Storage,
    admin: Conn,
    holder: Conn,
    path: Path,
    row: FenceRow,
    first: Literal["answer", "acquire"],
    acquire: Callable[[str, int], Coroutine[Any, Any, bool]],
) -> Forced:
    eid = f"forced-{uuid.uuid4().hex[:10]}"
    fence = await _park(appender, admin, eid, row)
    await holder.execute("BEGIN")
    await holder.execute(
        "SELECT 1 FROM loom_executions WHERE execution_id = %s FOR UPDATE", (eid,)
    )
    try:
        sides: dict[str, Coroutine[Any, Any, bool]] = {
            "answer": _answer(appender, eid, path, fence),
            "acquire": acquire(eid, fence),
        }
        second = "acquire" if first == "answer" else "answer"
        one = asyncio.create_task(sides[first])
        # The first side cannot finish while the head row is held: it must block.
        await _until_blocked(admin, 1, one)
        assert not one.done(), one.result()
        two = asyncio.create_task(sides[second])
        await _until_blocked(admin, 2, two)
    finally:
        await holder.execute("COMMIT")
    both = await asyncio.wait_for(asyncio.gather(one, two), GUARD)
    results = dict(zip((first, second), both, strict=True))
    log = await acquirer.events.read(eid)
    assert (len(log) == 3) == results["answer"]  # what each side was told is what happened
    probe = await acquirer.events.acquire_fence(eid)  # the token, moved once more
    return Forced(results["answer"], results["acquire"], probe - 1)


def _conditional(storage: Storage) -> Callable[[str, int], Coroutine[Any, Any, bool]]:
    async def acquire(eid: str, fence: int) -> bool:
        result = await storage.events.acquire_fence_if(eid, fence=fence, park_seq=1)
        return result.acquired

    return acquire


async def _forced_conditional(
    open_pg: Opener, schema: str, pg_url: str, admin: Conn, path: Path, row: FenceRow,
    first: Literal["answer", "acquire"],
) -> Forced:
    """Two nodes race an answer and a conditional acquire, ``first`` queued first behind a
    head row the test holds."""
    node_a = await open_pg(schema=schema)
    node_b = await open_pg(schema=schema)
    holder = await _connect(pg_url, schema)
    try:
        return await _forced(node_a, node_b, admin, holder, path, row, first,
                             _conditional(node_b))
    finally:
        await holder.close()


@pytest.mark.parametrize("row", ["none", "token-0", "acquired"])
@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_an_answer_queued_first_on_a_held_head_row_lands_and_the_acquire_is_stale(
    open_pg: Opener, schema: str, pg_url: str, admin: Conn, path: Path, row: FenceRow
) -> None:
    outcome = await _forced_conditional(open_pg, schema, pg_url, admin, path, row, "answer")
    fence = 1 if row == "acquired" else 0
    assert outcome == Forced(appended=True, acquired=False, token=fence)


@pytest.mark.parametrize("row", ["none", "token-0", "acquired"])
@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_an_acquire_queued_first_on_a_held_head_row_wins_and_the_answer_is_stale(
    open_pg: Opener, schema: str, pg_url: str, admin: Conn, path: Path, row: FenceRow
) -> None:
    outcome = await _forced_conditional(open_pg, schema, pg_url, admin, path, row, "acquire")
    fence = 1 if row == "acquired" else 0
    assert outcome == Forced(appended=False, acquired=True, token=fence + 1)


@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_negative_control_an_unconditional_acquire_in_the_same_interleaving_wins_too(
    open_pg: Opener, schema: str, pg_url: str, admin: Conn, path: Path
) -> None:
    # acquire_fence does not look at the log: queued behind the answer it moves the token
    # after the answer landed, fencing out the body that answer started. The forced
    # interleaving must show that double win, or it could not show one at all.
    node_a = await open_pg(schema=schema)
    node_b = await open_pg(schema=schema)

    async def unconditional(eid: str, fence: int) -> bool:
        return await node_b.events.acquire_fence(eid) == fence + 1

    holder = await _connect(pg_url, schema)
    try:
        outcome = await _forced(node_a, node_b, admin, holder, path, "none", "answer",
                                unconditional)
    finally:
        await holder.close()
    assert outcome == Forced(appended=True, acquired=True, token=1)


# -- free races (the scheduler decides; only the invariant is asserted) ------------------


@pytest.mark.parametrize("row", ["none", "token-0"])
@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_answering_append_and_conditional_acquire_never_both_win(
    open_pg: Opener, schema: str, admin: Conn, path: Path, row: FenceRow
) -> None:
    node_a = await open_pg(schema=schema)
    node_b = await open_pg(schema=schema)
    outcomes: Counter[str] = Counter()
    for i in range(RUNS):
        eid = f"race-{i}-{uuid.uuid4().hex[:6]}"
        await _park(node_a, admin, eid, row)
        appended, acquired = await asyncio.gather(
            _answer(node_a, eid, path, 0),
            node_b.events.acquire_fence_if(eid, fence=0, park_seq=1),
        )
        assert (len(await node_b.events.read(eid)) == 3) == appended
        outcomes[f"{appended}-{acquired.acquired}"] += 1
    assert set(outcomes) <= {"True-False", "False-True"}, outcomes


# -- isolation-tester style permutations ---------------------------------------------------

Step = tuple[str, str]  # (session, step)
# BEGIN takes neither a snapshot nor a lock (the first statement does), so where it falls
# in an ordering changes nothing: each session sends it with its first statement.
SESSIONS: dict[str, tuple[str, str]] = {
    "a": ("append", "commit"),  # the answering append
    "c": ("acquire", "commit"),  # acquire_fence_if
    "h": ("hold", "commit"),  # a third session holding the execution's head row
}


def interleavings() -> list[tuple[Step, ...]]:
    """Every ordering of the six steps that keeps each session's own order (90)."""
    slots = [name for name, steps in SESSIONS.items() for _ in steps]
    out = []
    for order in sorted(set(itertools.permutations(slots))):
        seen: Counter[str] = Counter()
        steps = []
        for name in order:
            steps.append((name, SESSIONS[name][seen[name]]))
            seen[name] += 1
        out.append(tuple(steps))
    return out


def test_the_permutations_are_every_interleaving() -> None:
    orders = interleavings()
    assert len(orders) == len(set(orders)) == 90


# The negative controls' protocols, each one element short of the real one.
UNORDERED_ACQUIRE = """
CREATE FUNCTION perm_unordered_acquire(p_id text, p_fence bigint, p_park_seq bigint,
                                       p_answering text[])
RETURNS TABLE (o_acquired boolean, o_status smallint)
LANGUAGE plpgsql VOLATILE AS $perm$
DECLARE
    cur bigint;
BEGIN
    -- acquire_fence_if without the head-row lock: ordered on the fence row alone.
    SELECT f.token INTO cur FROM loom_fences f WHERE f.execution_id = p_id FOR UPDATE;
    cur := coalesce(cur, 0);
    IF cur <> p_fence OR EXISTS (
        SELECT 1 FROM loom_events e
        WHERE e.execution_id = p_id AND e.sequence > p_park_seq
          AND e.kind = ANY (p_answering)
    ) THEN
        RETURN QUERY SELECT false, 3::smallint;
        RETURN;
    END IF;
    INSERT INTO loom_fences AS f (execution_id, token) VALUES (p_id, cur + 1)
    ON CONFLICT (execution_id) DO UPDATE SET token = EXCLUDED.token;
    RETURN QUERY SELECT true, 0::smallint;
END
$perm$
"""

EARLY_TOKEN_APPEND = """
CREATE FUNCTION perm_early_token_append(p_id text, p_seq bigint, p_fence bigint)
RETURNS smallint
LANGUAGE plpgsql VOLATILE AS $perm$
DECLARE
    cur bigint;
BEGIN
    -- a fenced append that reads the token before it locks the head row
    SELECT f.token INTO cur FROM loom_fences f WHERE f.execution_id = p_id;
    cur := coalesce(cur, 0);
    UPDATE loom_executions e SET head = e.head + 1
    WHERE e.execution_id = p_id AND e.head = p_seq;
    IF NOT FOUND THEN
        RETURN 1;
    END IF;
    IF cur <> p_fence THEN
        UPDATE loom_executions e SET head = p_seq WHERE e.execution_id = p_id;
        RETURN 3;
    END IF;
    INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, recorded_at)
    VALUES (p_id, p_seq, 'EXECUTION_RESUMED', 'null', '{}', clock_timestamp());
    RETURN 0;
END
$perm$
"""

FRESH_TOKENS = "loom_fence_tokens(%(fenced)s::text[]) t"
assert FRESH_TOKENS in MANY
# append_many reading the tokens in its own statement's snapshot, taken before it waited
# for the head rows.
MANY_SNAPSHOT_TOKENS = MANY.replace(
    FRESH_TOKENS,
    "(SELECT f.execution_id AS o_id, f.token AS o_token FROM loom_fences f "
    "WHERE f.execution_id = ANY (%(fenced)s::text[])) t",
)

Variant = Literal["protocol", "unordered-acquire", "early-token-append", "snapshot-tokens"]


# The permutations also play the lone append's own function (loom_write_one), which the
# store sends for a batch of one append.
PermPath = Literal["append", "append-alone", "append_many"]


def _append_statement(
    path: PermPath, eid: str, fence: int, variant: Variant
) -> tuple[str, Any]:
    if variant == "early-token-append":
        return "SELECT perm_early_token_append(%s, 2, %s)", (eid, fence)
    if path == "append-alone":
        return (
            WRITE_ONE,
            ("a", eid, 2, fence, 1, f'[["EXECUTION_RESUMED",null,{{"fence":{fence}}}]]',
             None, 1, 0.5),
        )
    if path == "append":
        return (
            'SELECT o_status FROM loom_batch(%s::"char"[], %s::text[], %s::bigint[], '
            "%s::bigint[], %s::integer[], %s::text[], %s::text[], %s::text[], %s::text[], "
            "%s::bigint, %s::text[], %s::text[], %s::float8)",
            (["a"], [eid], [2], [fence], [1], ["EXECUTION_RESUMED"], ["null"],
             [f'{{"fence":{fence}}}'], [None], 1, ANSWERING, KERNEL, 0.5),
        )
    return (
        MANY_SNAPSHOT_TOKENS if variant == "snapshot-tokens" else MANY,
        {"ids": [eid], "expected": [2], "fences": [fence], "counts": [1],
         "channels": [None], "fenced": [eid], "ev_req": [1], "ev_off": [0],
         "kinds": ["EXECUTION_RESUMED"], "payloads": ["null"],
         "metadata": [f'{{"fence":{fence}}}'], "writer": 1, "notify_limit": 0.5},
    )


def _acquire_statement(eid: str, fence: int, variant: Variant) -> tuple[str, Any]:
    if variant == "unordered-acquire":
        return (
            "SELECT o_acquired, o_status FROM perm_unordered_acquire(%s, %s, 1, %s)",
            (eid, fence, ANSWERING),
        )
    return (
        "SELECT o_acquired, o_status FROM loom_acquire_fence_if(%s, %s, 1, %s, %s)",
        (eid, fence, ANSWERING, KERNEL),
    )


@dataclass
class Refused:
    """A step PostgreSQL refused (the isolation guard, in these tests)."""

    error: psycopg.Error


class Permuter:
    """Three long-lived sessions and a monitor; plays one ordering at a time."""

    def __init__(self, sessions: dict[str, Conn], monitor: Conn) -> None:
        self.sessions = sessions
        self.monitor = monitor
        self.pids = {name: conn.info.backend_pid for name, conn in sessions.items()}

    async def _blocked(self, session: str) -> bool:
        others = [pid for name, pid in self.pids.items() if name != session]
        row = await (
            await self.monitor.execute(
                "SELECT pg_isolation_test_session_is_blocked(%s, %s)",
                (self.pids[session], others),
            )
        ).fetchone()
        return bool(row and row[0])

    async def _settle(self, session: str, task: asyncio.Task[Any]) -> bool:
        """Wait until ``task`` is done (True) or its session is blocked (False)."""

        async def poll() -> bool:
            while not task.done():
                if await self._blocked(session):
                    return False
                await asyncio.sleep(0.001)
            return True

        return await asyncio.wait_for(poll(), GUARD)

    async def _run(self, session: str, step: str, statement: tuple[str, Any] | None) -> Any:
        conn = self.sessions[session]
        if step == "commit":
            await conn.execute("COMMIT")
            return None
        await conn.execute("BEGIN")
        assert statement is not None
        try:
            row = await (await conn.execute(*statement)).fetchone()
        except psycopg.Error as exc:
            return Refused(exc)
        return row

    async def play(
        self, order: tuple[Step, ...], statements: dict[str, tuple[str, Any]]
    ) -> dict[str, Any] | None:
        """The result row of each session's statement, or None for an invalid ordering
        (a step of a session that is still blocked)."""
        results: dict[str, Any] = {}
        waiting: dict[str, tuple[str, asyncio.Task[Any]]] = {}
        try:
            for session, step in order:
                if session in waiting:
                    return None  # the isolation tester calls this an invalid permutation
                task = asyncio.create_task(self._run(session, step, statements.get(session)))
                waiting[session] = (step, task)
                # Let this step, and every earlier one it may have released, finish or
                # block again before the next step starts.
                changed = True
                while changed:
                    changed = False
                    for name, (started, pending) in list(waiting.items()):
                        if await self._settle(name, pending):
                            del waiting[name]
                            if started != "commit":
                                results[name] = pending.result()
                            changed = True
            assert not waiting, waiting
            return results
        finally:
            await self._reset({name: task for name, (_, task) in waiting.items()})

    async def _reset(self, waiting: dict[str, asyncio.Task[Any]]) -> None:
        """End every open transaction (an invalid ordering leaves some)."""
        while waiting:
            for name, conn in self.sessions.items():
                if name not in waiting:
                    await conn.execute("ROLLBACK")
            for name, pending in list(waiting.items()):
                if await self._settle(name, pending):
                    del waiting[name]
        for conn in self.sessions.values():
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                await conn.execute("ROLLBACK")


@dataclass
class Outcome:
    appended: bool
    acquired: bool
    refused: list[psycopg.Error]


def _outcome(path: PermPath, variant: Variant, results: dict[str, Any]) -> Outcome:
    refused = [r.error for r in results.values() if isinstance(r, Refused)]
    append, acquire = results["a"], results["c"]
    appended = not isinstance(append, Refused) and int(
        append[1] if path == "append_many" and variant != "early-token-append" else append[0]
    ) == 0
    acquired = not isinstance(acquire, Refused) and bool(acquire[0])
    return Outcome(appended, acquired, refused)


@pytest.fixture
async def rr_server(loom_postgres_server: PostgresServer) -> str:
    """A database whose sessions default to REPEATABLE READ."""
    url = loom_postgres_server.fresh_database("loom_rr_perm")
    async with await psycopg.AsyncConnection.connect(
        loom_postgres_server.url, autocommit=True
    ) as conn:
        await conn.execute(
            sql.SQL(
                "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'"
            ).format(sql.Identifier(url.rsplit("/", 1)[1]))
        )
    return url


async def _permutations(
    url: str, schema: str, path: PermPath, row: FenceRow, variant: Variant,
    *, stop_at_first_break: bool = False,
) -> list[tuple[tuple[Step, ...], Outcome]]:
    """Play every ordering on a fresh parked execution each; (ordering, outcome) of the
    valid ones."""
    out: list[tuple[tuple[Step, ...], Outcome]] = []
    async with await open_storage(url, options={"schema": schema}) as setup:
        admin = await _connect(url, schema)
        sessions = {name: await _connect(url, schema) for name in SESSIONS}
        monitor = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            if variant == "unordered-acquire":
                await admin.execute(UNORDERED_ACQUIRE)
            elif variant == "early-token-append":
                await admin.execute(EARLY_TOKEN_APPEND)
            permuter = Permuter(sessions, monitor)
            for order in interleavings():
                eid = f"perm-{uuid.uuid4().hex[:10]}"
                fence = await _park(setup, admin, eid, row)
                statements = {
                    "a": _append_statement(path, eid, fence, variant),
                    "c": _acquire_statement(eid, fence, variant),
                    "h": ("SELECT 1 FROM loom_executions WHERE execution_id = %s FOR UPDATE",
                          (eid,)),
                }
                results = await permuter.play(order, statements)
                if results is None:
                    continue
                outcome = _outcome(path, variant, results)
                out.append((order, outcome))
                if stop_at_first_break and outcome.appended and outcome.acquired:
                    break
        finally:
            for conn in (*sessions.values(), monitor, admin):
                await conn.close()
    return out


@pytest.mark.parametrize("row", ["none", "token-0", "acquired"])
@pytest.mark.parametrize("path", ["append", "append-alone", "append_many"])
async def test_every_valid_permutation_keeps_append_and_acquire_exclusive(
    pg_url: str, schema: str, path: PermPath, row: FenceRow
) -> None:
    played = await _permutations(pg_url, schema, path, row, "protocol")
    assert len(played) >= 30
    for order, outcome in played:
        assert not outcome.refused, (order, outcome)
        assert outcome.appended != outcome.acquired, (order, outcome)


@pytest.mark.parametrize("row", ["none", "token-0", "acquired"])
@pytest.mark.parametrize("path", ["append", "append-alone", "append_many"])
async def test_under_a_repeatable_read_default_every_permutation_refuses_and_none_breaks(
    rr_server: str, schema: str, path: PermPath, row: FenceRow
) -> None:
    # Sessions that take the server's REPEATABLE READ (the store itself sets READ
    # COMMITTED on its own sessions): the guards would see a frozen snapshot, so both
    # functions refuse to run, and nothing is written.
    played = await _permutations(rr_server, schema, path, row, "protocol")
    assert len(played) >= 30
    for order, outcome in played:
        assert not outcome.appended, (order, outcome)
        assert not outcome.acquired, (order, outcome)
        assert len(outcome.refused) == 2, (order, outcome)
        for error in outcome.refused:
            assert error.sqlstate == "LM001", error
            assert "only under READ COMMITTED" in str(error)


@pytest.mark.parametrize(
    ("variant", "path"),
    [
        ("unordered-acquire", "append"),
        ("unordered-acquire", "append-alone"),
        ("unordered-acquire", "append_many"),
        ("early-token-append", "append"),
        ("snapshot-tokens", "append_many"),
    ],
)
@pytest.mark.parametrize("row", ["none", "token-0"])
async def test_negative_control_without_one_element_of_the_protocol_a_permutation_breaks(
    pg_url: str, schema: str, variant: Variant, path: PermPath, row: FenceRow
) -> None:
    played = await _permutations(pg_url, schema, path, row, variant, stop_at_first_break=True)
    broken = [order for order, outcome in played if outcome.appended and outcome.acquired]
    assert broken, f"no interleaving broke the invariant without {variant}"
