"""The PostgreSQL event store: fenced, append-only logs with every optional method.

Writes. ``append``, ``append_if_unchanged``, ``acquire_fence`` and ``acquire_fence_if``
go through group commit (:mod:`loom_postgres.batching`): concurrent calls share one
``loom_batch(...)`` statement, so one round-trip and one commit, yet each keeps its own
all-or-nothing result and its own error. A write that leaves alone runs in its caller's
task, on its connection's one write cursor, and (other than ``acquire_fence_if``) runs
``loom_write_one(...)`` instead: the same logic with scalar parameters, so a lone writer
does not pay for adapting arrays it does not need.
``append_many`` is one statement of its own (the JOIN path). All paths follow the same
protocol (see docs/design.md, "How PostgreSQL orders the writers of an execution", and
the comments of ``loom_postgres.schema``): the head row every append locks orders the writers of one
execution; a fenced append reads the token only after that lock is granted, and
``acquire_fence`` / ``acquire_fence_if`` take it before they move the token. No append
locks the fence row, and no park needs one.

Lock order. Every writer takes an execution's head row before its fence row, and a
batch visits executions in id order, so writers cannot deadlock one another; a
deadlock that a foreign session causes is rolled back and re-run.

Lost connections. Every event row records the random id of the commit that wrote it.
When a connection breaks after a write was sent, the store reconnects (for up to
``reconnect_timeout``), ends the server session that ran the write (and waits for it to
exit, so its transaction has committed or never will), then looks that id up: an append
that landed is returned as a success, one that did not is re-run, so an acknowledged
event is never lost, never written twice, and never refused as a conflict with itself.
An acquire, or an append whose session could not be ended, raises
:class:`~loom_postgres.WriteOutcomeUnknownError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Final, Literal, cast

import psycopg
import psycopg_pool

from loom_core import Event, JsonObject, NewEvent
from loom_core.errors import (
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceNotIssuedError,
    InvalidInputError,
    InvalidSequenceError,
    LoomError,
    SequenceConflictError,
    StaleFenceError,
    StorageError,
    StoreClosedError,
)
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    MAX_POSITION,
    AppendRequest,
    ConditionalFence,
    FenceAcquired,
    FenceStale,
    RefusesUnoffered,
    build_event,
    build_new_event,
    canonical_json,
    check_append,
    check_append_requests,
    check_events_with_text,
    check_execution_id,
    check_fence,
    check_key,
    check_limit,
    check_read,
    check_sequence,
    json_text,
)
from loom_postgres.batching import GroupCommitter, Pending
from loom_postgres.database import Database, LostWriteError
from loom_postgres.errors import WriteOutcomeUnknownError
from loom_postgres.failures import Failure, classify, describe
from loom_postgres.notify import Listener
from loom_postgres.schema import ANSWERING_LITERAL, KERNEL_LITERAL

__all__ = ["LostConnectionStats", "PostgresEventStore"]

_OK, _SEQUENCE, _EXISTS, _STALE, _NOT_FOUND, _PAST_HEAD, _NOT_ISSUED = 0, 1, 2, 3, 4, 5, 6
_READ_PAGE: Final = 500

OpKind = Literal["a", "u", "f", "c"]

BATCH: Final = (
    'SELECT o_status, o_head, o_token, o_at, o_notified FROM loom_batch('
    '%s::"char"[], %b::text[], %b::bigint[], %b::bigint[], %b::integer[], %b::text[], '
    "%b::text[], %b::text[], %b::text[], %s::bigint, %s::text[], %s::text[], %s::float8)"
)

# A batch of one append, append_if_unchanged or acquire_fence (a lone writer, nothing to
# coalesce): loom_write_one, the same protocol and statuses as loom_batch, with scalar
# parameters and the events as one JSON array of [kind, payload, metadata].
WRITE_ONE: Final = (
    "SELECT o_status, o_head, o_token, o_at, o_notified FROM loom_write_one("
    '%s::"char", %s::text, %s::bigint, %s::bigint, %s::integer, %s::text, %s::text, '
    "%s::bigint, %s::float8)"
)

# Which of a lost commit's appends landed: their first rows carry its writer id.
LANDED: Final = """
SELECT e.execution_id, e.sequence, e.recorded_at
FROM unnest(%s::text[], %s::bigint[]) AS r(execution_id, sequence)
JOIN loom_events e ON e.execution_id = r.execution_id AND e.sequence = r.sequence
WHERE e.writer = %s
"""

READ: Final = """
SELECT sequence, kind, payload, metadata, recorded_at
FROM loom_events
WHERE execution_id = %s AND sequence >= %s AND sequence <= %s
ORDER BY sequence
LIMIT %s::bigint
"""

HEAD: Final = "SELECT head FROM loom_executions WHERE execution_id = %s"

LIST: Final = """
SELECT execution_id FROM loom_executions
WHERE execution_id > %s
ORDER BY execution_id
LIMIT %s
"""

DELETE: Final = "SELECT loom_delete_execution(%s)"
COPY: Final = "SELECT o_status, o_head, o_copied FROM loom_copy_prefix(%s, %s, %s, %s, %s)"
TRUNCATE: Final = "SELECT o_status, o_head, o_dropped FROM loom_truncate_prefix(%s, %s)"

# append_many: one statement. The head rows are locked first (FOR UPDATE, in id order:
# the lock order of loom_batch), then the tokens of the fenced requests are read by
# loom_fence_tokens, a VOLATILE function whose query takes a new snapshot after those
# locks were granted (the statement's own snapshot predates the wait, and would miss a
# token an acquirer committed meanwhile, or a fence row it created); the one-time filter
# on ``head`` makes that order certain. Then every request is judged, and only when all
# pass are heads moved and events written. No fence row is locked.
MANY: Final = """
WITH req AS MATERIALIZED (
    SELECT r.ord::integer AS ord, r.execution_id, r.expected, r.fence, r.n, r.channel
    FROM unnest(%(ids)s::text[], %(expected)s::bigint[], %(fences)s::bigint[],
                %(counts)s::integer[], %(channels)s::text[])
         WITH ORDINALITY AS r(execution_id, expected, fence, n, channel, ord)
),
head AS MATERIALIZED (
    SELECT h.execution_id, h.head
    FROM loom_executions h
    WHERE h.execution_id IN (SELECT q.execution_id FROM req q)
    ORDER BY h.execution_id
    FOR UPDATE OF h
),
fence AS MATERIALIZED (
    SELECT t.o_id AS execution_id, t.o_token AS token
    FROM loom_fence_tokens(%(fenced)s::text[]) t
    WHERE (SELECT count(*) FROM head) >= 0
),
verdict AS MATERIALIZED (
    SELECT r.ord, r.execution_id, r.expected, r.fence, r.n, r.channel,
           coalesce(h.head, 0) AS cur_head,
           coalesce(f.token, 0) AS cur_token,
           CASE WHEN coalesce(h.head, 0) <> r.expected
                    THEN CASE WHEN r.expected = 0 THEN 2 ELSE 1 END
                WHEN r.fence IS NOT NULL AND r.fence < coalesce(f.token, 0) THEN 3
                WHEN r.fence IS NOT NULL AND r.fence > coalesce(f.token, 0) THEN 6
                ELSE 0 END AS status
    FROM req r
    LEFT JOIN head h ON h.execution_id = r.execution_id
    LEFT JOIN fence f ON f.execution_id = r.execution_id
),
go AS MATERIALIZED (
    SELECT bool_and(v.status = 0) AS ok,
           count(*) FILTER (WHERE v.expected = 0) AS creating,
           clock_timestamp() AS at
    FROM verdict v
),
created AS (
    INSERT INTO loom_executions (execution_id, head)
    SELECT v.execution_id, v.n FROM verdict v CROSS JOIN go
    WHERE go.ok AND v.expected = 0
    ON CONFLICT DO NOTHING
    RETURNING 1
),
moved AS (
    UPDATE loom_executions h SET head = v.expected + v.n
    FROM verdict v CROSS JOIN go
    WHERE go.ok AND v.expected > 0 AND h.execution_id = v.execution_id
    RETURNING 1
),
written AS (
    INSERT INTO loom_events
        (execution_id, sequence, kind, payload, metadata, recorded_at, writer)
    SELECT v.execution_id, v.expected + e.off, e.kind, e.payload::json, e.metadata::json,
           go.at, %(writer)s
    FROM unnest(%(ev_req)s::integer[], %(ev_off)s::integer[], %(kinds)s::text[],
                %(payloads)s::text[], %(metadata)s::text[])
         AS e(req, off, kind, payload, metadata)
    JOIN verdict v ON v.ord = e.req
    CROSS JOIN go
    WHERE go.ok
    RETURNING 1
),
woken AS (
    SELECT pg_notify(v.channel, v.execution_id)
    FROM verdict v CROSS JOIN go
    WHERE go.ok AND v.channel IS NOT NULL
      AND pg_notification_queue_usage() < %(notify_limit)s
)
SELECT v.ord, v.status, v.cur_head, v.cur_token, go.at,
       (SELECT count(*) FROM woken) AS woken,
       (SELECT count(*) FROM moved) AS moved,
       (SELECT count(*) FROM written) AS written,
       -- a creator that committed after our snapshot: re-run the statement
       loom_retry_unless(
           NOT go.ok OR (SELECT count(*) FROM created) = go.creating,
           'append_many: an execution was created concurrently; re-run'
       ) AS checked
FROM verdict v CROSS JOIN go
ORDER BY v.ord
"""


@dataclass(slots=True)
class LostConnectionStats:
    """What the store found after connections broke with writes in flight: appends that
    had ``landed`` (returned as successes), appends re-run because they had not, and
    writes reported as ``unknown`` (WriteOutcomeUnknownError)."""

    landed: int = 0
    rerun: int = 0
    unknown: int = 0


@dataclass(slots=True)
class _Write:
    """One write as group commit carries it."""

    op: OpKind
    execution_id: str
    seq: int
    fence: int | None
    events: tuple[NewEvent, ...] = ()
    payloads: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()
    channel: str | None = None


def _encode_metadata(metadata: JsonObject) -> str:
    """JSON text of ``metadata``, its keys in their order (as the payload's: a read hands
    back what append did), without the encoder for the two shapes nearly every append
    has: nothing, or only the stamped token."""
    if not metadata:
        return "{}"
    if len(metadata) == 1:
        fence = metadata.get("fence")
        if type(fence) is int:
            return f'{{"fence":{fence}}}'
    return json_text(metadata)


@lru_cache(maxsize=1024)
def _kind_json(kind: str) -> str:
    return canonical_json(kind)


def _events_json(w: _Write) -> str:
    """The events of ``w`` as loom_write_one takes them: a JSON array of [kind, payload,
    metadata], built from the texts already encoded (so stored byte for byte as the batch
    path stores them)."""
    return "[" + ",".join(
        f"[{_kind_json(event.kind)},{payload},{metadata}]"
        for event, payload, metadata in zip(w.events, w.payloads, w.metadata, strict=True)
    ) + "]"


def _execution_id(item: Pending[_Write, object]) -> str:
    return item.op.execution_id


class PostgresEventStore(RefusesUnoffered):
    """Event logs in PostgreSQL; offers every optional method.

    Built by :func:`loom_postgres.open_postgres` (``open_storage("postgresql://…")``),
    which owns the pool and closes it with the storage.
    """

    def __init__(self, db: Database, listener: Listener) -> None:
        self._db = db
        self._listener = listener
        options = db.options
        self._committer: GroupCommitter[_Write, object] = GroupCommitter(
            self._run_batch,
            max_batch=options.max_batch,
            max_inflight=options.max_inflight_batches,
        )
        self._closed = False
        self.lost_connections = LostConnectionStats()

    @property
    def group_commit(self) -> GroupCommitter[_Write, object]:
        """The group committer (its ``batches``/``writes`` counters show the coalescing)."""
        return self._committer

    # -- building writes ----------------------------------------------------------------

    def _append(
        self,
        op: OpKind,
        execution_id: str,
        events: tuple[NewEvent, ...],
        expected_sequence: int,
        fence: int | None,
        *,
        stamp: bool,
        texts: tuple[str, ...] | None = None,
    ) -> _Write:
        """``texts``: each payload's JSON text as the check wrote it
        (``check_events_with_text``), else each is encoded here."""
        if stamp and fence is not None:
            stamped: tuple[NewEvent, ...] = tuple(
                build_new_event(event.kind, event.payload, {**event.metadata, "fence": fence})
                for event in events
            )
        else:
            stamped = events  # check_append's own copies: nobody else holds them
        encoded = [_encode_metadata(cast(JsonObject, event.metadata)) for event in stamped]
        return _Write(
            op=op,
            execution_id=execution_id,
            seq=expected_sequence,
            fence=fence,
            events=stamped,
            payloads=(
                tuple([json_text(e.payload) for e in stamped]) if texts is None else texts
            ),
            metadata=tuple(encoded),
            channel=self._listener.channel(execution_id),
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("this PostgreSQL event store")

    # -- group commit -------------------------------------------------------------------

    async def _run_batch(self, batch: list[Pending[_Write, object]]) -> None:
        # Id order is the lock order that keeps concurrent batches deadlock-free.
        ordered = batch if len(batch) == 1 else sorted(batch, key=_execution_id)
        await self._execute(ordered, time.monotonic() + self._db.options.reconnect_timeout)

    def _batch_params(
        self, ordered: list[Pending[_Write, object]], writer: int
    ) -> tuple[object, ...]:
        ops: list[str] = []
        ids: list[str] = []
        seqs: list[int] = []
        fences: list[int | None] = []
        counts: list[int] = []
        kinds: list[str] = []
        payloads: list[str] = []
        metadata: list[str] = []
        channels: list[str | None] = []
        for item in ordered:
            w = item.op
            ops.append(w.op)
            ids.append(w.execution_id)
            seqs.append(w.seq)
            fences.append(w.fence)
            counts.append(len(w.events))
            channels.append(w.channel)
            for event in w.events:
                kinds.append(event.kind)
            payloads.extend(w.payloads)
            metadata.extend(w.metadata)
        return (
            ops, ids, seqs, fences, counts, kinds, payloads, metadata, channels, writer,
            ANSWERING_LITERAL, KERNEL_LITERAL, self._db.options.notify_queue_limit,
        )

    def _statement(
        self, ordered: list[Pending[_Write, object]], writer: int
    ) -> tuple[str, tuple[object, ...]]:
        """The statement that runs ``ordered``: loom_write_one for one write alone (but
        acquire_fence_if), else loom_batch."""
        if len(ordered) == 1:
            w = ordered[0].op
            if w.op != "c":
                return WRITE_ONE, (
                    w.op, w.execution_id, w.seq, w.fence, len(w.events), _events_json(w),
                    w.channel, writer, self._db.options.notify_queue_limit,
                )
        return BATCH, self._batch_params(ordered, writer)

    async def _execute(self, ordered: list[Pending[_Write, object]], deadline: float) -> None:
        """Run ``ordered`` as one batch; settle every write, whatever happens."""
        attempt = 0
        while True:
            writer = secrets.randbits(63)
            query, params = self._statement(ordered, writer)
            try:
                conn = await self._db.pool.getconn()
            except (psycopg_pool.PoolTimeout, psycopg.OperationalError) as exc:
                # Nothing was sent: wait for the server while the deadline allows.
                self._db.connection_lost()
                if time.monotonic() >= deadline:
                    for item in ordered:
                        item.reject(self._db.error(
                            exc, self._what(item.op), item.op.execution_id, write=False
                        ))
                    return
                await asyncio.sleep(min(1.0, 0.02 * 2**attempt))
                attempt += 1
                continue
            pid = conn.pgconn.backend_pid
            try:
                cur = conn.write_cursor()
                await cur.execute(query, params, prepare=True)
                rows = await cur.fetchall()
            except psycopg.Error as exc:
                await self._db.pool.putconn(conn)
                await self._failed(ordered, writer, exc, deadline, pid)
                return
            except BaseException:
                await self._db.pool.putconn(conn)
                raise
            await self._db.pool.putconn(conn)
            self._settle(ordered, rows)
            return

    async def _failed(
        self,
        ordered: list[Pending[_Write, object]],
        writer: int,
        exc: psycopg.Error,
        deadline: float,
        pid: int,
    ) -> None:
        failure = classify(exc)
        if failure is Failure.CONNECTION:
            self._db.connection_lost()
            await self._resolve(ordered, writer, exc, deadline, pid)
            return
        if len(ordered) > 1:
            # The batch was rolled back as a whole: run each write alone, so the one that
            # failed fails alone and the others land.
            await asyncio.gather(*(self._alone(item, deadline) for item in ordered))
            return
        item = ordered[0]
        if failure is Failure.TRANSIENT:
            await self._alone(item, deadline, retried=True)
            return
        item.reject(self._db.error(exc, self._what(item.op), item.op.execution_id, write=True))

    async def _alone(
        self, item: Pending[_Write, object], deadline: float, *, retried: bool = False
    ) -> None:
        transient = 0
        while True:
            writer = secrets.randbits(63)
            pid: int | None = None
            try:
                async with self._db.pool.connection() as conn:
                    pid = conn.info.backend_pid
                    cur = await conn.execute(*self._statement([item], writer), prepare=True)
                    rows = await cur.fetchall()
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                failure = classify(exc)
                if failure is Failure.CONNECTION:
                    self._db.connection_lost()
                    await self._resolve([item], writer, exc, deadline, pid)
                    return
                if failure is Failure.UNAVAILABLE and time.monotonic() < deadline:
                    self._db.connection_lost()
                    await asyncio.sleep(0.05)
                    continue
                if failure is Failure.TRANSIENT and transient < 5:
                    transient += 1
                    await asyncio.sleep(0.005 * transient)
                    continue
                item.reject(
                    self._db.error(exc, self._what(item.op), item.op.execution_id, write=True)
                )
                return
            self._settle([item], rows)
            return

    async def _resolve(
        self,
        ordered: list[Pending[_Write, object]],
        writer: int,
        exc: psycopg.Error,
        deadline: float,
        pid: int | None,
    ) -> None:
        """The connection broke after the batch was sent: end the session that ran it,
        then find out what landed."""
        appends = [item for item in ordered if item.op.op in ("a", "u")]
        stats = self.lost_connections
        # Before the lookup: a transaction still running there could commit after it.
        settled = await self._db.end_session(pid, deadline)
        for item in ordered:
            if item.op.op not in ("a", "u"):
                stats.unknown += 1
                item.reject(
                    WriteOutcomeUnknownError(self._what(item.op), item.op.execution_id,
                                             describe(exc))
                )
        if not appends:
            return
        try:
            rows = await self._db.fetch(
                LANDED,
                ([i.op.execution_id for i in appends], [i.op.seq for i in appends], writer),
                what="checking appends after a lost connection",
            )
        except StorageError as lookup:
            stats.unknown += len(appends)
            for item in appends:
                item.reject(
                    WriteOutcomeUnknownError(
                        self._what(item.op), item.op.execution_id,
                        f"{describe(exc)}; then {lookup}",
                    )
                )
            return
        landed = {(str(r[0]), int(r[1])): cast(datetime, r[2]) for r in rows}
        rerun: list[Pending[_Write, object]] = []
        for item in appends:
            at = landed.get((item.op.execution_id, item.op.seq))
            if at is not None:
                stats.landed += 1
                self._succeeded(item, at, notified=True)
            else:
                rerun.append(item)
        if rerun:
            if not settled or time.monotonic() >= deadline:
                why = "deadline passed" if settled else "its session may still be running"
                stats.unknown += len(rerun)
                for item in rerun:
                    item.reject(
                        WriteOutcomeUnknownError(self._what(item.op), item.op.execution_id,
                                                 f"{describe(exc)}; {why}")
                    )
                return
            # Not there, and its session has ended, so it cannot appear later: re-running
            # is exact.
            stats.rerun += len(rerun)
            await self._execute(rerun, deadline)

    def _settle(
        self, ordered: list[Pending[_Write, object]], rows: list[tuple[object, ...]]
    ) -> None:
        if len(rows) != len(ordered):  # cannot happen unless the function is not ours
            error = StorageError(
                f"loom_batch returned {len(rows)} rows for {len(ordered)} writes; the schema "
                "does not match this version of loom-postgres"
            )
            for item in ordered:
                item.reject(error)
            return
        for item, row in zip(ordered, rows, strict=True):
            status, head, token, at, notified = row
            w = item.op
            if w.op == "f":
                item.resolve(int(cast(int, token)))
            elif w.op == "c":
                self._settle_conditional(item, int(cast(int, status)), head, token)
            elif status == _OK:
                self._succeeded(item, cast(datetime, at), notified=bool(notified))
            elif status == _SEQUENCE:
                item.reject(SequenceConflictError(w.execution_id, w.seq, int(cast(int, head))))
            elif status == _EXISTS:
                item.reject(ExecutionAlreadyExistsError(w.execution_id, int(cast(int, head))))
            elif status == _NOT_ISSUED:
                item.reject(
                    FenceNotIssuedError(w.execution_id, w.fence or 0, int(cast(int, token)))
                )
            else:
                presented = w.fence if w.fence is not None else 0
                item.reject(StaleFenceError(w.execution_id, presented, int(cast(int, token))))

    @staticmethod
    def _settle_conditional(
        item: Pending[_Write, object], status: int, head: object, token: object
    ) -> None:
        w = item.op
        if status == _NOT_FOUND:
            item.reject(ExecutionNotFoundError(w.execution_id))
        elif status == _PAST_HEAD:
            item.reject(
                InvalidSequenceError(
                    f"park_seq {w.seq} is at or past the head of {w.execution_id!r} "
                    f"({int(cast(int, head))})"
                )
            )
        elif status == _OK:
            item.resolve(FenceAcquired(int(cast(int, token))))
        else:
            item.resolve(FenceStale(int(cast(int, token))))

    def _succeeded(self, item: Pending[_Write, object], at: datetime, *, notified: bool) -> None:
        w = item.op
        eid, seq = w.execution_id, w.seq
        # Each event's metadata is this write's own dict (check_append's fresh copy, or
        # the stamped one built for it), so the returned event can keep it.
        item.resolve(
            tuple(
                build_event(eid, seq + i, e.kind, e.payload, cast(JsonObject, e.metadata), at)
                for i, e in enumerate(w.events)
            )
        )
        self._listener.wake(w.execution_id)
        if w.channel is not None and not notified:
            self._db.warn(
                "notify-queue",
                "loom-postgres: the NOTIFY queue is above notify_queue_limit "
                f"({self._db.options.notify_queue_limit:.0%}); appends keep committing but "
                "skip cross-node wake-ups (subscribers on other nodes poll). Find the "
                "session that LISTENs without reading (the server log names its PID) and "
                "terminate it; watch pg_notification_queue_usage().",
            )

    @staticmethod
    def _what(w: _Write) -> str:
        return {
            "a": "append", "u": "append_if_unchanged", "f": "acquire_fence",
            "c": "acquire_fence_if",
        }[w.op]

    # -- required -----------------------------------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        execution_id = check_execution_id(execution_id)
        checked, texts = check_events_with_text(events)
        expected_sequence = check_sequence(expected_sequence, "expected_sequence")
        if fence is not None:
            fence = check_fence(fence)
        self._check_open()
        write = self._append(
            "a", execution_id, checked, expected_sequence, fence, stamp=True, texts=texts
        )
        return cast(tuple[Event, ...], await self._committer.submit(write))

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        execution_id, from_sequence, to_sequence, limit = check_read(
            execution_id, from_sequence, to_sequence, limit
        )
        self._check_open()
        upper = MAX_POSITION if to_sequence is None else to_sequence
        rows = await self._db.fetch(
            READ, (execution_id, from_sequence, upper, limit), what="read",
            execution_id=execution_id,
        )
        return tuple(
            build_event(
                execution_id,
                int(sequence),
                str(kind),
                payload,
                cast(JsonObject, metadata),
                cast(datetime, recorded_at),
            )
            for sequence, kind, payload, metadata, recorded_at in rows
        )

    async def head(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        self._check_open()
        rows = await self._db.fetch(HEAD, (execution_id,), what="head", execution_id=execution_id)
        return int(rows[0][0]) if rows else 0

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        if after is not None:
            after = check_key(after, "after")
        limit = check_limit(limit)
        self._check_open()
        rows = await self._db.fetch(LIST, (after or "", limit), what="list_executions")
        return tuple(str(row[0]) for row in rows)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._committer.close()
        await self._listener.close()

    # -- optional -----------------------------------------------------------------------

    async def acquire_fence(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        self._check_open()
        return cast(int, await self._committer.submit(_Write("f", execution_id, 0, None)))

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        execution_id = check_execution_id(execution_id)
        fence = check_fence(fence)
        park_seq = check_sequence(park_seq, "park_seq")
        self._check_open()
        result = await self._committer.submit(_Write("c", execution_id, park_seq, fence))
        return cast(ConditionalFence, result)

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        execution_id, checked, expected_sequence = check_append(
            execution_id, events, expected_sequence
        )
        observed_fence = check_fence(observed_fence, "observed_fence")
        self._check_open()
        write = self._append(
            "u", execution_id, checked, expected_sequence, observed_fence, stamp=False
        )
        return cast(tuple[Event, ...], await self._committer.submit(write))

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        checked = check_append_requests(requests)
        self._check_open()
        writes = [
            self._append("a", r.execution_id, events, r.expected_sequence, r.fence, stamp=True)
            for r, events in checked
        ]
        ev_req: list[int] = []
        ev_off: list[int] = []
        kinds: list[str] = []
        payloads: list[str] = []
        metadata: list[str] = []
        for ordinal, w in enumerate(writes, start=1):
            for offset, event in enumerate(w.events):
                ev_req.append(ordinal)
                ev_off.append(offset)
                kinds.append(event.kind)
            payloads.extend(w.payloads)
            metadata.extend(w.metadata)
        deadline = time.monotonic() + self._db.options.reconnect_timeout
        first = writes[0]
        while True:
            writer = secrets.randbits(63)
            params = {
                "ids": [w.execution_id for w in writes],
                "expected": [w.seq for w in writes],
                "fences": [w.fence for w in writes],
                "counts": [len(w.events) for w in writes],
                "channels": [w.channel for w in writes],
                "fenced": [w.execution_id for w in writes if w.fence is not None],
                "ev_req": ev_req,
                "ev_off": ev_off,
                "kinds": kinds,
                "payloads": payloads,
                "metadata": metadata,
                "writer": writer,
                "notify_limit": self._db.options.notify_queue_limit,
            }
            try:
                rows = await self._db.fetch(
                    MANY, params, what="append_many",
                    execution_id=first.execution_id, write=True, idempotent=False,
                )
            except LostWriteError as exc:
                # All or nothing: the first request's first row tells for every request.
                outcome = await self._landed_many(writes, writer, exc)
                if outcome is None:
                    if not exc.settled or time.monotonic() >= deadline:
                        raise
                    continue  # its session has ended, and it did not land: run it again
                return self._many_events(writes, outcome)
            break
        at = cast(datetime, rows[0][4])
        for row, w in zip(rows, writes, strict=True):
            status = int(cast(int, row[1]))
            if status == _SEQUENCE:
                raise SequenceConflictError(w.execution_id, w.seq, int(cast(int, row[2])))
            if status == _EXISTS:
                raise ExecutionAlreadyExistsError(w.execution_id, int(cast(int, row[2])))
            if status == _STALE:
                raise StaleFenceError(w.execution_id, w.fence or 0, int(cast(int, row[3])))
            if status == _NOT_ISSUED:
                raise FenceNotIssuedError(w.execution_id, w.fence or 0, int(cast(int, row[3])))
        woken = int(cast(int, rows[0][5]))
        if woken < sum(1 for w in writes if w.channel is not None):
            self._db.warn("notify-queue", "loom-postgres: NOTIFY queue above the limit; "
                          "cross-node wake-ups skipped")
        return self._many_events(writes, at)

    async def _landed_many(
        self, writes: list[_Write], writer: int, exc: LoomError
    ) -> datetime | None:
        w = writes[0]
        try:
            rows = await self._db.fetch(
                LANDED, ([w.execution_id], [w.seq], writer),
                what="checking append_many after a lost connection",
            )
        except StorageError as lookup:
            raise WriteOutcomeUnknownError("append_many", w.execution_id,
                                           f"{exc}; then {lookup}") from lookup
        return cast(datetime, rows[0][2]) if rows else None

    def _many_events(self, writes: list[_Write], at: datetime) -> tuple[tuple[Event, ...], ...]:
        out = []
        for w in writes:
            out.append(
                tuple(
                    build_event(w.execution_id, w.seq + i, e.kind, e.payload, dict(e.metadata), at)
                    for i, e in enumerate(w.events)
                )
            )
            self._listener.wake(w.execution_id)
        return tuple(out)

    async def delete_execution(self, execution_id: str) -> bool:
        execution_id = check_execution_id(execution_id)
        self._check_open()
        rows = await self._db.fetch(
            DELETE, (execution_id,), what="delete_execution", execution_id=execution_id,
            write=True,
        )
        return bool(rows[0][0])

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        source = check_execution_id(source)
        target = check_execution_id(target)
        through_sequence = check_sequence(through_sequence, "through_sequence")
        if source == target:
            raise InvalidInputError(f"copy_prefix source and target are both {source!r}")
        self._check_open()
        # through + 1 must fit a bigint; the function reports it past the head anyway.
        through = min(through_sequence, MAX_POSITION - 1)
        rows = await self._db.fetch(
            COPY,
            (source, target, through, self._listener.channel(target),
             self._db.options.notify_queue_limit),
            what="copy_prefix", execution_id=target, write=True, idempotent=False,
        )
        status, head, copied = (int(cast(int, v)) for v in rows[0])
        if status == _NOT_FOUND:
            raise ExecutionNotFoundError(source)
        if status == _PAST_HEAD:
            raise InvalidSequenceError(
                f"through_sequence {through_sequence} is past the head of {source!r} ({head})"
            )
        if status == _EXISTS:
            raise ExecutionAlreadyExistsError(target, head)
        self._listener.wake(target)
        return copied

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        execution_id = check_execution_id(execution_id)
        keep_from_sequence = check_sequence(keep_from_sequence, "keep_from_sequence")
        self._check_open()
        rows = await self._db.fetch(
            TRUNCATE, (execution_id, keep_from_sequence),
            what="truncate_prefix_keeping", execution_id=execution_id, write=True,
        )
        status, head, dropped = (int(cast(int, v)) for v in rows[0])
        if status == _NOT_FOUND:
            raise ExecutionNotFoundError(execution_id)
        if status == _PAST_HEAD:
            raise InvalidSequenceError(
                f"keep_from_sequence {keep_from_sequence} is past the head of "
                f"{execution_id!r} ({head})"
            )
        return dropped

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        execution_id = check_execution_id(execution_id)
        from_sequence = check_sequence(from_sequence, "from_sequence")
        self._check_open()
        return self._follow(execution_id, from_sequence)

    async def _follow(self, execution_id: str, next_sequence: int) -> AsyncIterator[Event]:
        options = self._db.options
        watch = await self._listener.watch(
            execution_id, ready_timeout=options.subscribe_poll_interval
        )
        try:
            while not self._closed:
                # Clear before reading: a wake-up that arrives during the read is kept.
                watch.signal.clear()
                batch = await self.read(execution_id, from_sequence=next_sequence,
                                        limit=_READ_PAGE)
                if batch:
                    for event in batch:
                        next_sequence = event.sequence + 1
                        yield event
                    continue
                if self._closed:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.signal.wait(), options.subscribe_poll_interval)
        finally:
            watch.release()
