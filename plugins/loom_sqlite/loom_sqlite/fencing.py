"""Fence tokens on SQLite: the SQL and the checks, run inside a write transaction.

Several processes on one host may share the file, so a zombie writer (a process that lost
its execution to another and does not know it yet) is real here. Each function below runs
on the connection's thread inside the ``BEGIN IMMEDIATE`` transaction of its operation
(:mod:`loom_sqlite.transactions`). ``BEGIN IMMEDIATE`` takes SQLite's one write lock
before the first read, so between a check here and the write that follows it no other
writer — task, thread or process — can run: the check and the bump of
``acquire_fence_if`` are one atomic step, as the conditional acquire requires (see
docs/design.md, "The conditional acquire"), and a fenced append's
token check cannot be overtaken by an acquire. ``acquire`` is a single statement, which
SQLite runs atomically as a transaction of its own; a lone caller's acquire runs so, with
no ``BEGIN`` around it.

A never-fenced execution has token 0 and no row. ``acquire_fence`` creates the row at 1,
and so does ``delete_execution`` of a log that existed: a delete moves the token one past
its current value, so every holder, the runner of the deleted log included, is stale on a
re-created id (docs/design.md, "Deleting a log fences out its writers"). Nothing else
creates a row, so a refusal never leaves a fence row behind. A token presented to a
fenced append above the current one was never issued
(:class:`~loom_core.errors.FenceNotIssuedError`): accepting it would let a caller with a
wrong number outrank every later acquire.

The answered-park scan (the "no answering event past the park" condition) classifies
each event past the park from its ``kind`` and ``metadata`` when it runs, exactly as
:func:`loom_core.spi.is_answering_kind` does: a kind in the kernel's answering list, or
a kind that is not a kernel kind at all whose ``metadata.kernel`` is JSON ``true``
(``json_type(...) = 'true'``: the number 1 and the string ``"true"`` do not count, while
``json_extract(...) = 1`` would take the number). The two kind lists are bound as JSON
arrays, built from the kernel's own sets, so there is one classification. Nothing derived
is stored: a flag written beside the event could be flipped in the file without touching
the columns an audit chain covers, and the acquire would then win over an answered park.
The scan reads the primary key from the park to the head: the events after a park are
few (a denial, an annotation, the answer).
"""

from __future__ import annotations

import sqlite3
from typing import Final

from loom_core import JsonValue
from loom_core.errors import (
    ExecutionNotFoundError,
    FenceNotIssuedError,
    InvalidSequenceError,
    StaleFenceError,
)
from loom_core.spi import (
    ANSWERING_KINDS,
    KERNEL_KINDS,
    ConditionalFence,
    FenceAcquired,
    FenceStale,
    canonical_json,
)

__all__ = [
    "acquire",
    "acquire_if",
    "check_presented",
    "check_unchanged",
    "current_token",
    "fence_out_on_delete",
    "state",
]

SELECT_STATE: Final = """
SELECT max(coalesce((SELECT floor FROM loom_logs WHERE execution_id = :id), 0),
           coalesce((SELECT max(sequence) + 1 FROM loom_events WHERE execution_id = :id), 0)),
       (SELECT token FROM loom_fences WHERE execution_id = :id)
"""
SELECT_TOKEN: Final = "SELECT token FROM loom_fences WHERE execution_id = ?"
BUMP_TOKEN: Final = """
INSERT INTO loom_fences (execution_id, token) VALUES (?, 1)
ON CONFLICT (execution_id) DO UPDATE SET token = token + 1
RETURNING token
"""
ANSWERED_AFTER: Final = """
SELECT 1 FROM loom_events
WHERE execution_id = :id AND sequence > :park AND sequence < :head
  AND (kind IN (SELECT value FROM json_each(:answering))
       OR (kind NOT IN (SELECT value FROM json_each(:kernel))
           AND json_type(metadata, '$.kernel') = 'true'))
LIMIT 1
"""


def _json_list(kinds: frozenset[str]) -> str:
    listed: list[JsonValue] = [*sorted(kinds)]
    return canonical_json(listed)


ANSWERING_KINDS_JSON: Final = _json_list(ANSWERING_KINDS)
KERNEL_KINDS_JSON: Final = _json_list(KERNEL_KINDS)


def state(raw: sqlite3.Connection, execution_id: str) -> tuple[int, int]:
    """The execution's head (0: no log) and token (0: never fenced), in one statement.

    The head is one past the last event, or the log's floor when truncation removed every
    event (:mod:`loom_sqlite.schema`): two seeks of a primary key, no scan."""
    head, token = raw.execute(SELECT_STATE, {"id": execution_id}).fetchone()
    return int(head), (0 if token is None else int(token))


def current_token(raw: sqlite3.Connection, execution_id: str) -> int:
    row = raw.execute(SELECT_TOKEN, (execution_id,)).fetchone()
    return 0 if row is None else int(row[0])


def acquire(raw: sqlite3.Connection, execution_id: str) -> int:
    """Bump the token (0 → 1 for a never-fenced execution) and return it."""
    return int(raw.execute(BUMP_TOKEN, (execution_id,)).fetchall()[0][0])


def acquire_if(
    raw: sqlite3.Connection, execution_id: str, fence: int, park_seq: int
) -> ConditionalFence:
    """Bump only if the token is ``fence`` and no answering event exists
    past ``park_seq``; otherwise change nothing and return the current token.

    Refuses, changing nothing, an execution with no log (``ExecutionNotFoundError``) and
    a park at or past the head (``InvalidSequenceError``), in that order. A ``fence``
    above the current token is stale, not refused: a park copied by ``copy_prefix``
    carries its source's token while the copy's is 0, and the resumer retries with the
    token this returns.
    """
    head, current = state(raw, execution_id)
    if head == 0:
        raise ExecutionNotFoundError(execution_id)
    if park_seq >= head:
        raise InvalidSequenceError(
            f"park_seq {park_seq} is at or past the head of {execution_id!r} ({head}); "
            "pass the sequence of the park being answered"
        )
    if current != fence or _answered_after(raw, execution_id, park_seq, head):
        return FenceStale(current)
    return FenceAcquired(acquire(raw, execution_id))


def _answered_after(raw: sqlite3.Connection, execution_id: str, park_seq: int, head: int) -> bool:
    params = {
        "id": execution_id,
        "park": park_seq,
        "head": head,
        "answering": ANSWERING_KINDS_JSON,
        "kernel": KERNEL_KINDS_JSON,
    }
    return raw.execute(ANSWERED_AFTER, params).fetchone() is not None


def check_presented(execution_id: str, presented: int, current: int) -> None:
    """A fenced append: refuse a token below the execution's (a newer writer holds it)
    and one above it (no acquire returned it)."""
    if presented < current:
        raise StaleFenceError(execution_id, presented, current)
    if presented > current:
        raise FenceNotIssuedError(execution_id, presented, current)


def check_unchanged(raw: sqlite3.Connection, execution_id: str, observed: int) -> None:
    """``append_if_unchanged``: refuse unless the token still equals ``observed`` (above
    it too is stale: this never presents a token, it compares one it read)."""
    current = current_token(raw, execution_id)
    if current != observed:
        raise StaleFenceError(execution_id, observed, current)


def fence_out_on_delete(raw: sqlite3.Connection, execution_id: str) -> None:
    """On delete of a log that existed: bump the token (0 → 1 with no row), so whoever
    held it cannot write into a re-created log of the same id."""
    raw.execute(BUMP_TOKEN, (execution_id,)).fetchall()
