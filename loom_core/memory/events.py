"""The in-memory event store: the embedded default and the conformance kit's reference.

Every method validates its arguments, yields to the event loop once, then does its work in
one synchronous step, so concurrent asyncio tasks interleave between calls but never inside
one: ``acquire_fence_if`` (compare the token, binary-search to ``park_seq``, scan the tail
for an answering event, bump) is atomic by construction.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from loom_core.errors import (
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceNotIssuedError,
    InvalidInputError,
    InvalidOptionError,
    InvalidSequenceError,
    SequenceConflictError,
    StaleFenceError,
    StoreClosedError,
)
from loom_core.events import Event, JsonObject, NewEvent
from loom_core.kinds import is_answering_kind
from loom_core.protocols import (
    DEFAULT_LIST_LIMIT,
    OPTIONAL_EVENT_STORE_METHODS,
    AppendRequest,
    ConditionalFence,
    FenceAcquired,
    FenceStale,
    OptionalMethod,
)
from loom_core.refusal import RefusesUnoffered
from loom_core.validation import (
    canonical_json,
    check_append,
    check_append_requests,
    check_execution_id,
    check_fence,
    check_limit,
    check_read,
    check_sequence,
)

__all__ = ["MemoryEventStore"]

Clock = Callable[[], datetime]


@dataclass(slots=True)
class _Stored:
    """An event kept as JSON text, so no caller can mutate what the store holds."""

    sequence: int
    kind: str
    payload: str
    metadata: str
    recorded_at: datetime
    answering: bool


@dataclass(slots=True)
class _Log:
    head: int = 0
    events: list[_Stored] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)


class MemoryEventStore(RefusesUnoffered):
    """Process-local event log with full fencing and every optional method.

    ``offer`` narrows the optional methods this instance offers (the rest raise
    ``Unsupported``), which the conformance kit uses to build an inner store that lacks
    them. ``clock`` is the store clock for ``recorded_at``.
    """

    def __init__(
        self,
        *,
        offer: Iterable[OptionalMethod] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if offer is not None:
            if isinstance(offer, str):
                raise InvalidOptionError("offer must be a collection of method names, not a str")
            offered = frozenset(offer)
            unknown = offered - set(OPTIONAL_EVENT_STORE_METHODS)
            if unknown:
                raise InvalidOptionError(f"offer names unknown optional methods {sorted(unknown)}")
            self._offered = offered
        else:
            self._offered = frozenset(OPTIONAL_EVENT_STORE_METHODS)
        if clock is not None and not callable(clock):
            raise InvalidOptionError("clock must be a callable returning an aware datetime")
        self._clock: Clock = clock or (lambda: datetime.now(UTC))
        self._logs: dict[str, _Log] = {}
        self._fences: dict[str, int] = {}
        self._signals: dict[str, asyncio.Event] = {}
        self._closed = False

    @property
    def capabilities(self) -> frozenset[OptionalMethod]:
        return self._offered

    def _offers(self, method: OptionalMethod) -> None:
        self._check_open()
        if method not in self._offered:
            self._refuse(method, "not offered by this instance (MemoryEventStore(offer=...))")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("this in-memory event store")

    # -- internals ----------------------------------------------------------------------

    def _event(self, execution_id: str, stored: _Stored) -> Event:
        return Event(
            execution_id=execution_id,
            sequence=stored.sequence,
            kind=stored.kind,
            payload=json.loads(stored.payload),
            metadata=json.loads(stored.metadata),
            recorded_at=stored.recorded_at,
        )

    def _check_append(
        self, execution_id: str, expected_sequence: int, fence: int | None
    ) -> None:
        log = self._logs.get(execution_id)
        head = log.head if log else 0
        if expected_sequence != head:
            if expected_sequence == 0:
                raise ExecutionAlreadyExistsError(execution_id, head)
            raise SequenceConflictError(execution_id, expected_sequence, head)
        if fence is not None:
            current = self._fences.get(execution_id, 0)
            if fence < current:
                raise StaleFenceError(execution_id, fence, current)
            if fence > current:
                raise FenceNotIssuedError(execution_id, fence, current)

    def _prepare(
        self, execution_id: str, events: Sequence[NewEvent], fence: int | None, now: datetime
    ) -> tuple[list[_Stored], tuple[Event, ...]]:
        """Encode a checked append without touching the log, so a batch whose last
        request cannot be encoded leaves every log as it was."""
        log = self._logs.get(execution_id)
        sequence = log.head if log else 0
        stored: list[_Stored] = []
        written: list[Event] = []
        for event in events:
            metadata: JsonObject = dict(event.metadata)
            if fence is not None:
                metadata["fence"] = fence
            stored.append(
                _Stored(
                    sequence=sequence,
                    kind=event.kind,
                    payload=canonical_json(event.payload),
                    metadata=canonical_json(metadata),
                    recorded_at=now,
                    answering=is_answering_kind(event.kind, metadata),
                )
            )
            # ``events`` are validated copies the caller cannot reach, so the written
            # events can carry them instead of decoding the JSON just encoded.
            written.append(Event(execution_id, sequence, event.kind, event.payload, metadata, now))
            sequence += 1
        return stored, tuple(written)

    def _commit(self, execution_id: str, stored: list[_Stored]) -> None:
        log = self._logs.setdefault(execution_id, _Log())
        log.events.extend(stored)
        log.sequences.extend(s.sequence for s in stored)
        log.head = stored[-1].sequence + 1
        self._wake(execution_id)

    def _write(
        self, execution_id: str, events: Sequence[NewEvent], fence: int | None
    ) -> tuple[Event, ...]:
        stored, written = self._prepare(execution_id, events, fence, self._clock())
        self._commit(execution_id, stored)
        return written

    def _wake(self, execution_id: str) -> None:
        signal = self._signals.pop(execution_id, None)
        if signal is not None:
            signal.set()

    async def _tick(self) -> None:
        # One yield per call: tasks interleave between store operations, never inside one.
        # Closed is checked after the yield too, so a call that raced close() is refused.
        self._check_open()
        await asyncio.sleep(0)
        self._check_open()

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
        self._check_append(execution_id, expected_sequence, fence)
        return self._write(execution_id, checked, fence)

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
        log = self._logs.get(execution_id)
        if log is None:
            return ()
        start = bisect.bisect_left(log.sequences, from_sequence)
        end = (
            len(log.sequences)
            if to_sequence is None
            else bisect.bisect_right(log.sequences, to_sequence)
        )
        if limit is not None:
            end = min(end, start + limit)
        return tuple(self._event(execution_id, s) for s in log.events[start:end])

    async def head(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        await self._tick()
        log = self._logs.get(execution_id)
        return log.head if log else 0

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        if after is not None:
            after = check_execution_id(after)
        limit = check_limit(limit)
        await self._tick()
        ids = sorted(self._logs)
        start = 0 if after is None else bisect.bisect_right(ids, after)
        return tuple(ids[start : start + limit])

    async def close(self) -> None:
        self._closed = True
        for execution_id in list(self._signals):
            self._wake(execution_id)

    # -- optional -----------------------------------------------------------------------

    async def acquire_fence(self, execution_id: str) -> int:
        self._offers("acquire_fence")
        execution_id = check_execution_id(execution_id)
        await self._tick()
        token = self._fences.get(execution_id, 0) + 1
        self._fences[execution_id] = token
        return token

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        self._offers("acquire_fence_if")
        execution_id = check_execution_id(execution_id)
        fence = check_fence(fence)
        park_seq = check_sequence(park_seq, "park_seq")
        await self._tick()
        log = self._logs.get(execution_id)
        if log is None:
            raise ExecutionNotFoundError(execution_id)
        if park_seq >= log.head:
            raise InvalidSequenceError(
                f"park_seq {park_seq} is at or past the head of {execution_id!r} ({log.head}); "
                "pass the sequence of the park being answered"
            )
        current = self._fences.get(execution_id, 0)
        if current != fence:
            return FenceStale(current)
        tail = bisect.bisect_right(log.sequences, park_seq)
        if any(stored.answering for stored in log.events[tail:]):
            return FenceStale(current)
        self._fences[execution_id] = current + 1
        return FenceAcquired(current + 1)

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        self._offers("append_if_unchanged")
        execution_id, checked, expected_sequence = check_append(
            execution_id, events, expected_sequence
        )
        observed_fence = check_fence(observed_fence, "observed_fence")
        await self._tick()
        current = self._fences.get(execution_id, 0)
        if current != observed_fence:
            raise StaleFenceError(execution_id, observed_fence, current)
        self._check_append(execution_id, expected_sequence, None)
        return self._write(execution_id, checked, None)

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        self._offers("append_many")
        checked = check_append_requests(requests)
        await self._tick()
        for request, _ in checked:
            self._check_append(request.execution_id, request.expected_sequence, request.fence)
        now = self._clock()
        prepared = [self._prepare(r.execution_id, events, r.fence, now) for r, events in checked]
        for (request, _), (stored, _) in zip(checked, prepared, strict=True):
            self._commit(request.execution_id, stored)
        return tuple(written for _, written in prepared)

    async def delete_execution(self, execution_id: str) -> bool:
        self._offers("delete_execution")
        execution_id = check_execution_id(execution_id)
        await self._tick()
        # The token stays: a zombie writer of a re-created id stays fenced out. (This store
        # never holds a token-0 entry, so there is nothing inert to drop.)
        return self._logs.pop(execution_id, None) is not None

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        self._offers("copy_prefix")
        source = check_execution_id(source)
        target = check_execution_id(target)
        through_sequence = check_sequence(through_sequence, "through_sequence")
        if source == target:
            raise InvalidInputError(f"copy_prefix source and target are both {source!r}")
        await self._tick()
        log = self._logs.get(source)
        if log is None:
            raise ExecutionNotFoundError(source)
        if through_sequence >= log.head:
            raise InvalidSequenceError(
                f"through_sequence {through_sequence} is past the head of {source!r} ({log.head})"
            )
        existing = self._logs.get(target)
        if existing is not None:
            raise ExecutionAlreadyExistsError(target, existing.head)
        end = bisect.bisect_right(log.sequences, through_sequence)
        copy = _Log(head=through_sequence + 1)
        copy.events = [
            _Stored(s.sequence, s.kind, s.payload, s.metadata, s.recorded_at, s.answering)
            for s in log.events[:end]
        ]
        copy.sequences = log.sequences[:end]
        self._logs[target] = copy
        self._wake(target)
        return len(copy.events)

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        self._offers("truncate_prefix_keeping")
        execution_id = check_execution_id(execution_id)
        keep_from_sequence = check_sequence(keep_from_sequence, "keep_from_sequence")
        await self._tick()
        log = self._logs.get(execution_id)
        if log is None:
            raise ExecutionNotFoundError(execution_id)
        if keep_from_sequence > log.head:
            raise InvalidSequenceError(
                f"keep_from_sequence {keep_from_sequence} is past the head of "
                f"{execution_id!r} ({log.head})"
            )
        cut = bisect.bisect_left(log.sequences, keep_from_sequence)
        del log.events[:cut]
        del log.sequences[:cut]
        return cut

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        self._offers("subscribe")
        execution_id = check_execution_id(execution_id)
        from_sequence = check_sequence(from_sequence, "from_sequence")
        return self._follow(execution_id, from_sequence)

    async def _follow(self, execution_id: str, next_sequence: int) -> AsyncIterator[Event]:
        while not self._closed:
            log = self._logs.get(execution_id)
            batch: list[_Stored] = []
            if log is not None:
                start = bisect.bisect_left(log.sequences, next_sequence)
                batch = log.events[start:]
            if batch:
                for stored in batch:
                    next_sequence = stored.sequence + 1
                    yield self._event(execution_id, stored)
                continue
            signal = self._signals.get(execution_id)
            if signal is None:
                signal = self._signals[execution_id] = asyncio.Event()
            await signal.wait()
