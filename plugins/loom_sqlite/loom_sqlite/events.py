"""The SQLite event store: a fenced, append-only log per execution, every optional method.

Each public method validates its arguments on the caller's side with the kernel's checks
(``check_*`` from :mod:`loom_core.spi`: a refused call touches nothing), prepares the rows
(JSON text, the ``fence`` stamp), and hands one *operation* to
:class:`~loom_sqlite.transactions.TransactionRunner`: a function that does all of that
method's SQL on the connection's thread, inside one ``BEGIN IMMEDIATE`` transaction for a
write. The operation checks first and writes last; a refusal
(:class:`~loom_core.errors.SequenceConflictError`, :class:`~loom_core.errors.StaleFenceError`,
…) raised from it is rolled back with it, so a refused append leaves the file exactly as
it was. Semantics match the in-memory reference
store, :class:`loom_core.memory.MemoryEventStore`.

The log of an execution is its rows in ``loom_events``; its head is one past the last
of them, and never below the floor a truncation or a copy wrote in ``loom_logs`` (a log
truncated to nothing keeps its head there). An append writes its events and nothing
else: one page of the file to commit, where a head row moved by every append made two.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Final

from loom_core import Event, JsonObject, JsonValue, NewEvent
from loom_core.errors import (
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    InvalidInputError,
    InvalidSequenceError,
    SequenceConflictError,
    StorageReadError,
)
from loom_core.spi import (
    DEFAULT_LIST_LIMIT,
    MAX_POSITION,
    AppendRequest,
    ConditionalFence,
    RefusesUnoffered,
    build_event,
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
from loom_sqlite import fencing
from loom_sqlite.backup import backup_database
from loom_sqlite.clock import from_micros, host_clock, now_micros
from loom_sqlite.errors import DatabaseClosedError
from loom_sqlite.settings import Clock
from loom_sqlite.subscribe import Subscriptions
from loom_sqlite.transactions import TransactionRunner

__all__ = ["SqliteEventStore"]

SET_FLOOR: Final = """
INSERT INTO loom_logs (execution_id, floor) VALUES (?, ?)
ON CONFLICT (execution_id) DO UPDATE SET floor = excluded.floor
"""
INSERT_EVENT: Final = """
INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, recorded_at)
VALUES (?, ?, ?, ?, ?, ?)
"""
SELECT_EVENTS: Final = """
SELECT sequence, kind, payload, metadata, recorded_at FROM loom_events
WHERE execution_id = :id AND sequence >= :start AND sequence <= :end
ORDER BY sequence
LIMIT :limit
"""
# The ids that have events, one primary-key seek each (the next id after the last one:
# a log's events are never scanned), merged with those that have only a floor.
LIST_EXECUTIONS: Final = """
WITH RECURSIVE ids (execution_id) AS (
    SELECT (SELECT min(execution_id) FROM loom_events WHERE execution_id > :after)
    UNION ALL
    SELECT (SELECT min(execution_id) FROM loom_events WHERE execution_id > ids.execution_id)
    FROM ids WHERE ids.execution_id IS NOT NULL
    LIMIT :limit
)
SELECT execution_id FROM ids WHERE execution_id IS NOT NULL
UNION
SELECT execution_id FROM (
    SELECT execution_id FROM loom_logs WHERE execution_id > :after
    ORDER BY execution_id LIMIT :limit
)
ORDER BY execution_id LIMIT :limit
"""
DELETE_EXECUTION: Final = "DELETE FROM loom_logs WHERE execution_id = ?"
DELETE_EVENTS: Final = "DELETE FROM loom_events WHERE execution_id = ?"
COPY_EVENTS: Final = """
INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, recorded_at)
SELECT ?, sequence, kind, payload, metadata, recorded_at FROM loom_events
WHERE execution_id = ? AND sequence <= ?
"""
TRUNCATE_EVENTS: Final = "DELETE FROM loom_events WHERE execution_id = ? AND sequence < ?"

_NO_LIMIT: Final = -1  # SQLite: a negative LIMIT means none


@dataclass(slots=True)
class _Row:
    """One event ready to insert: the values to return and the text to store (private to
    one call, so not frozen: a frozen dataclass costs a setattr call per field)."""

    kind: str
    payload: JsonValue
    metadata: JsonObject
    payload_text: str
    metadata_text: str


def _prepare(
    events: Sequence[NewEvent], fence: int | None, texts: Sequence[str] | None = None
) -> tuple[_Row, ...]:
    """The rows to insert; ``texts``: each payload's JSON text as the check wrote it
    (``check_events_with_text``), else each is encoded here."""
    if fence is None:
        stamp: JsonObject = {}
        stamp_text = "{}"
    else:
        stamp = {"fence": fence}
        stamp_text = f'{{"fence":{int(fence)}}}'  # json_text(stamp), without its encoder
    if len(events) == 1:
        # Most appends carry one event, most events no metadata of their own: their
        # text is the stamp's, encoded once.
        (event,) = events
        if event.metadata:
            metadata: JsonObject = {**event.metadata, **stamp}
            metadata_text = json_text(metadata)
        else:
            metadata, metadata_text = dict(stamp), stamp_text
        text = json_text(event.payload) if texts is None else texts[0]
        return (_Row(event.kind, event.payload, metadata, text, metadata_text),)
    rows = []
    for i, event in enumerate(events):
        if event.metadata:
            metadata = {**event.metadata, **stamp}
            metadata_text = json_text(metadata)
        else:
            metadata, metadata_text = dict(stamp), stamp_text
        text = json_text(event.payload) if texts is None else texts[i]
        rows.append(_Row(event.kind, event.payload, metadata, text, metadata_text))
    return tuple(rows)


# -- operations: run on the connection's thread -----------------------------------------


def _check_head(execution_id: str, expected: int, head: int) -> None:
    if expected != head:
        if expected == 0:
            raise ExecutionAlreadyExistsError(execution_id, head)
        raise SequenceConflictError(execution_id, expected, head)


def _insert(
    raw: sqlite3.Connection, execution_id: str, head: int, rows: Sequence[_Row], now: int
) -> tuple[Event, ...]:
    recorded_at = from_micros(now)
    if len(rows) == 1:
        # The usual append: one statement, no list (cheaper than executemany).
        (r,) = rows
        raw.execute(
            INSERT_EVENT, (execution_id, head, r.kind, r.payload_text, r.metadata_text, now)
        )
        return (build_event(execution_id, head, r.kind, r.payload, r.metadata, recorded_at),)
    raw.executemany(
        INSERT_EVENT,
        [
            (execution_id, head + i, r.kind, r.payload_text, r.metadata_text, now)
            for i, r in enumerate(rows)
        ],
    )
    return tuple(
        build_event(execution_id, head + i, r.kind, r.payload, r.metadata, recorded_at)
        for i, r in enumerate(rows)
    )


def _append(
    execution_id: str,
    rows: tuple[_Row, ...],
    expected: int,
    fence: int | None,
    clock: Clock,
    raw: sqlite3.Connection,
) -> tuple[Event, ...]:
    # Positional, the connection last: the partial that carries the rest calls it without
    # building a dict of keywords (this is every append's path).
    head, token = fencing.state(raw, execution_id)
    _check_head(execution_id, expected, head)
    if fence is not None:
        fencing.check_presented(execution_id, fence, token)
    return _insert(raw, execution_id, head, rows, now_micros(clock))


def _append_if_unchanged(
    raw: sqlite3.Connection,
    *,
    execution_id: str,
    rows: tuple[_Row, ...],
    expected: int,
    observed: int,
    clock: Clock,
) -> tuple[Event, ...]:
    fencing.check_unchanged(raw, execution_id, observed)
    head, _ = fencing.state(raw, execution_id)
    _check_head(execution_id, expected, head)
    return _insert(raw, execution_id, head, rows, now_micros(clock))


def _append_many(
    raw: sqlite3.Connection,
    *,
    requests: tuple[tuple[AppendRequest, tuple[_Row, ...]], ...],
    clock: Clock,
) -> tuple[tuple[Event, ...], ...]:
    heads = []
    for request, _ in requests:
        head, token = fencing.state(raw, request.execution_id)
        _check_head(request.execution_id, request.expected_sequence, head)
        if request.fence is not None:
            fencing.check_presented(request.execution_id, request.fence, token)
        heads.append(head)
    now = now_micros(clock)
    return tuple(
        _insert(raw, request.execution_id, head, rows, now)
        for (request, rows), head in zip(requests, heads, strict=True)
    )


def _decode(text: str, execution_id: str, sequence: int, column: str) -> JsonValue:
    try:
        value: JsonValue = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        # Only a hand edit of the file (or a damaged page) puts non-JSON here: Loom
        # validates every payload before it writes.
        raise StorageReadError(
            f"event {sequence} of {execution_id!r} has a {column} that is not JSON ({exc}); "
            "the row was changed outside Loom: restore it from a backup"
        ) from exc
    return value


def _decode_object(text: str, execution_id: str, sequence: int) -> JsonObject:
    value = _decode(text, execution_id, sequence, "metadata")
    if not isinstance(value, dict):
        raise StorageReadError(
            f"event {sequence} of {execution_id!r} has metadata that is not a JSON object; "
            "the row was changed outside Loom: restore it from a backup"
        )
    return value


def _read(
    raw: sqlite3.Connection, execution_id: str, start: int, end: int, limit: int
) -> tuple[Event, ...]:
    return tuple([
        build_event(
            execution_id,
            sequence,
            kind,
            _decode(payload, execution_id, sequence, "payload"),
            _decode_object(metadata, execution_id, sequence),
            from_micros(recorded_at),
        )
        for sequence, kind, payload, metadata, recorded_at in raw.execute(
            SELECT_EVENTS, {"id": execution_id, "start": start, "end": end, "limit": limit}
        )
    ])


def _head(raw: sqlite3.Connection, execution_id: str) -> int:
    head, _ = fencing.state(raw, execution_id)  # the one place the head is derived
    return head


def _list(raw: sqlite3.Connection, after: str, limit: int) -> tuple[str, ...]:
    return tuple(row[0] for row in raw.execute(LIST_EXECUTIONS, {"after": after, "limit": limit}))


def _delete(raw: sqlite3.Connection, execution_id: str) -> bool:
    existed = raw.execute(DELETE_EXECUTION, (execution_id,)).rowcount > 0
    existed = raw.execute(DELETE_EVENTS, (execution_id,)).rowcount > 0 or existed
    if existed:
        fencing.fence_out_on_delete(raw, execution_id)
    return existed


def _copy_prefix(raw: sqlite3.Connection, source: str, target: str, through: int) -> int:
    source_head = _head_or_missing(raw, source)
    if through >= source_head:
        raise InvalidSequenceError(
            f"through_sequence {through} is past the head of {source!r} ({source_head})"
        )
    target_head = _head(raw, target)
    if target_head:
        raise ExecutionAlreadyExistsError(target, target_head)
    copied = raw.execute(COPY_EVENTS, (target, source, through)).rowcount
    raw.execute(SET_FLOOR, (target, through + 1))
    return copied


def _truncate(raw: sqlite3.Connection, execution_id: str, keep_from: int) -> int:
    head = _head_or_missing(raw, execution_id)
    if keep_from > head:
        raise InvalidSequenceError(
            f"keep_from_sequence {keep_from} is past the head of {execution_id!r} ({head})"
        )
    # The head outlives the events: truncating them all leaves the floor to keep it.
    raw.execute(SET_FLOOR, (execution_id, head))
    return raw.execute(TRUNCATE_EVENTS, (execution_id, keep_from)).rowcount


def _head_or_missing(raw: sqlite3.Connection, execution_id: str) -> int:
    head = _head(raw, execution_id)
    if not head:
        raise ExecutionNotFoundError(execution_id)
    return head


# -- the store ----------------------------------------------------------------------------


class SqliteEventStore(RefusesUnoffered):
    """Event log in a SQLite file; offers every optional method of the SPI.

    Opened by ``open_storage("sqlite:///path.db")``; shares its connection with the timer
    and lease stores of the same :class:`~loom_core.Storage`.
    """

    def __init__(
        self, runner: TransactionRunner, subscriptions: Subscriptions, clock: Clock | None
    ) -> None:
        self._runner = runner
        self._subscriptions = subscriptions
        self._clock: Clock = clock or host_clock
        self._closed = False

    @property
    def path(self) -> str:
        """The database file."""
        return self._runner.path

    def _open(self) -> TransactionRunner:
        if self._closed:
            raise DatabaseClosedError(self._runner.path)
        return self._runner

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
        op = functools.partial(
            _append, execution_id, _prepare(checked, fence, texts), expected_sequence, fence,
            self._clock,
        )
        written = await self._open().write(op, doing=f"appending to {execution_id!r}")
        self._subscriptions.wake(execution_id)
        return written

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
        return await self._read(
            execution_id,
            from_sequence,
            MAX_POSITION if to_sequence is None else to_sequence,
            _NO_LIMIT if limit is None else limit,
        )

    async def _read(
        self, execution_id: str, start: int, end: int, limit: int
    ) -> tuple[Event, ...]:
        return await self._open().read(
            functools.partial(_read, execution_id=execution_id, start=start, end=end, limit=limit),
            doing=f"reading {execution_id!r}",
        )

    async def head(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        return await self._open().read(
            functools.partial(_head, execution_id=execution_id),
            doing=f"reading the head of {execution_id!r}",
        )

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        if after is not None:
            after = check_key(after, "after")
        limit = check_limit(limit)
        # Every id is non-empty, so "after the empty string" is "from the start".
        return await self._open().read(
            functools.partial(_list, after=after or "", limit=limit),
            doing="listing executions",
        )

    async def close(self) -> None:
        """Stop this store's subscriptions; the connection closes with the storage."""
        if self._closed:
            return
        self._closed = True
        await self._subscriptions.close()

    # -- optional -----------------------------------------------------------------------

    async def acquire_fence(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        return await self._open().write(
            functools.partial(fencing.acquire, execution_id=execution_id),
            doing=f"acquiring a fence on {execution_id!r}",
            one_statement=True,
        )

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        execution_id = check_execution_id(execution_id)
        fence = check_fence(fence)
        park_seq = check_sequence(park_seq, "park_seq")
        return await self._open().write(
            functools.partial(
                fencing.acquire_if,
                execution_id=execution_id,
                fence=fence,
                park_seq=park_seq,
            ),
            doing=f"acquiring a conditional fence on {execution_id!r}",
        )

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
        op = functools.partial(
            _append_if_unchanged,
            execution_id=execution_id,
            rows=_prepare(checked, None),
            expected=expected_sequence,
            observed=observed_fence,
            clock=self._clock,
        )
        written = await self._open().write(op, doing=f"appending to {execution_id!r}")
        self._subscriptions.wake(execution_id)
        return written

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        checked = check_append_requests(requests)
        prepared = tuple((request, _prepare(events, request.fence)) for request, events in checked)
        op = functools.partial(_append_many, requests=prepared, clock=self._clock)
        written = await self._open().write(
            op, doing=f"appending to {len(prepared)} executions at once"
        )
        for request, _ in prepared:
            self._subscriptions.wake(request.execution_id)
        return written

    async def delete_execution(self, execution_id: str) -> bool:
        execution_id = check_execution_id(execution_id)
        return await self._open().write(
            functools.partial(_delete, execution_id=execution_id),
            doing=f"deleting {execution_id!r}",
        )

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        source = check_execution_id(source)
        target = check_execution_id(target)
        through_sequence = check_sequence(through_sequence, "through_sequence")
        if source == target:
            raise InvalidInputError(f"copy_prefix source and target are both {source!r}")
        copied = await self._open().write(
            functools.partial(_copy_prefix, source=source, target=target, through=through_sequence),
            doing=f"copying {source!r} to {target!r}",
        )
        self._subscriptions.wake(target)
        return copied

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        execution_id = check_execution_id(execution_id)
        keep_from_sequence = check_sequence(keep_from_sequence, "keep_from_sequence")
        return await self._open().write(
            functools.partial(_truncate, execution_id=execution_id, keep_from=keep_from_sequence),
            doing=f"truncating {execution_id!r}",
        )

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        execution_id = check_execution_id(execution_id)
        from_sequence = check_sequence(from_sequence, "from_sequence")
        self._open()
        return self._subscriptions.follow(
            execution_id,
            from_sequence,
            lambda eid, start, limit: self._read(eid, start, MAX_POSITION, limit),
        )

    # -- SQLite only --------------------------------------------------------------------

    async def backup(self, target_path: str) -> None:
        """Copy the whole database (log, fences, timers, leases) to ``target_path`` with
        SQLite's online backup API; see :func:`loom_sqlite.backup.backup_database`."""
        connection = self._open().connection
        # By the file opened, not the URL's path: a relative one names another file
        # after a chdir.
        await backup_database(replace(connection.settings, path=connection.file), target_path)
