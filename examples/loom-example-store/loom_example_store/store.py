"""A dict-backed event store: one process, no persistence, full fencing.

Every method validates its arguments with the ``check_*`` of ``loom_core.spi`` (so bad input is
refused exactly as every other store refuses it), yields to the event loop once, then does
its work without awaiting again, so concurrent asyncio tasks can never interleave inside
one call: the check and the write of ``append``, and the compare, scan and bump of
``acquire_fence_if``, are atomic.

Offered optional methods: ``acquire_fence`` and ``acquire_fence_if``. The others are
inherited from :class:`~loom_core.spi.RefusesUnoffered`, which raises ``Unsupported`` and keeps
them out of ``capabilities``.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from datetime import UTC, datetime

from loom_core import (
    Event,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceAcquired,
    FenceNotIssuedError,
    FenceStale,
    InvalidSequenceError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    StoreClosedError,
    is_answering,
)
from loom_core.spi import (
    ConditionalFence,
    RefusesUnoffered,
    check_append,
    check_execution_id,
    check_fence,
    check_key,
    check_limit,
    check_read,
    check_sequence,
)

__all__ = ["DictEventStore"]


class DictEventStore(RefusesUnoffered):
    """Logs in a dict of lists; tokens in a dict (a missing entry is token 0)."""

    def __init__(self) -> None:
        self._logs: dict[str, list[Event]] = {}
        self._tokens: dict[str, int] = {}
        self._closed = False

    async def _tick(self) -> None:
        """Yield to the event loop once; refuse on either side of it once closed."""
        if self._closed:
            raise StoreClosedError("this DictEventStore")
        await asyncio.sleep(0)
        if self._closed:
            raise StoreClosedError("this DictEventStore")

    # -- required -----------------------------------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        execution_id, checked, expected_sequence = check_append(
            execution_id, events, expected_sequence
        )
        if fence is not None:
            fence = check_fence(fence)
        await self._tick()
        log = self._logs.get(execution_id, [])
        if expected_sequence != len(log):
            if expected_sequence == 0:
                raise ExecutionAlreadyExistsError(execution_id, len(log))
            raise SequenceConflictError(execution_id, expected_sequence, len(log))
        current = self._tokens.get(execution_id, 0)
        if fence is not None and fence < current:
            raise StaleFenceError(execution_id, fence, current)
        if fence is not None and fence > current:
            raise FenceNotIssuedError(execution_id, fence, current)
        now = datetime.now(UTC)
        written = []
        for offset, event in enumerate(checked):
            metadata = dict(event.metadata)
            if fence is not None:
                metadata["fence"] = fence
            written.append(
                Event(execution_id, expected_sequence + offset, event.kind,
                      copy.deepcopy(event.payload), metadata, now)
            )
        self._logs[execution_id] = [*log, *written]
        return tuple(copy.deepcopy(written))

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
        await self._tick()
        log = self._logs.get(execution_id, [])
        end = len(log) if to_sequence is None else min(len(log), to_sequence + 1)
        if limit is not None:
            end = min(end, from_sequence + limit)
        # Copies, so a caller that mutates what it read cannot change the log.
        return tuple(copy.deepcopy(log[from_sequence:end]))

    async def head(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        await self._tick()
        return len(self._logs.get(execution_id, []))

    async def list_executions(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[str, ...]:
        if after is not None:
            after = check_key(after, "after")
        limit = check_limit(limit)
        await self._tick()
        # Python compares str by code point: the order the contract asks for.
        ids = sorted(i for i in self._logs if after is None or i > after)
        return tuple(ids[:limit])

    async def close(self) -> None:
        self._closed = True

    # -- offered optional methods ---------------------------------------------------------

    async def acquire_fence(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        await self._tick()
        token = self._tokens.get(execution_id, 0) + 1
        self._tokens[execution_id] = token
        return token

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        """Bump only if the token is ``fence`` AND nothing answers past ``park_seq``
        (the token alone cannot see a resume that was already appended; see
        docs/design.md, "The conditional acquire")."""
        execution_id = check_execution_id(execution_id)
        fence = check_fence(fence)
        park_seq = check_sequence(park_seq, "park_seq")
        await self._tick()
        log = self._logs.get(execution_id)
        if not log:
            raise ExecutionNotFoundError(execution_id)
        if park_seq >= len(log):
            raise InvalidSequenceError(
                f"park_seq {park_seq} is at or past the head of {execution_id!r} ({len(log)})"
            )
        current = self._tokens.get(execution_id, 0)
        tail = log[park_seq + 1 :]
        if current != fence or any(is_answering(event) for event in tail):
            return FenceStale(current)
        self._tokens[execution_id] = current + 1
        return FenceAcquired(current + 1)
