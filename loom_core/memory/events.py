"""The in-memory event store: the embedded default and the conformance kit's reference.

Every method validates its arguments, lets the event loop run other tasks (one call in
``YIELD_EVERY`` yields, see loom_core.memory.turns), then does its work in one synchronous
step, so concurrent asyncio tasks interleave between calls but never inside one:
``acquire_fence_if`` (compare the token, binary-search to ``park_seq``, scan the tail for
an answering event, bump) is atomic by construction.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from loom_core.checked import CheckedEvents, Encoded, _object, decode
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
from loom_core.events import Event, NewEvent, _UnfrozenEvent, build_event
from loom_core.memory.turns import YIELD_EVERY, one_turn
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
    _EMPTY,
    MAX_ID_BYTES,
    MAX_POSITION,
    Copies,
    _check_batch,
    _check_single,
    check_append_requests,
    check_execution_id,
    check_fence,
    check_key,
    check_limit,
    check_read,
    check_sequence,
)

__all__ = ["MemoryEventStore"]

Clock = Callable[[], datetime]


_Entry = tuple[str, Encoded, Encoded, "int | None", datetime, bool]
"""One event as the store holds it: kind, payload and metadata as the JSON bytes their
check produced, the fence it was written under, when, and whether it answers a park."""


def _kept(encoded: Encoded) -> Encoded:
    """``encoded`` as a log keeps it: bytes of their own, exactly as long as the text.

    orjson returns its output in an object that keeps the buffer it wrote into (about a
    kilobyte up to orjson 3.11, four from 3.12, whatever the text's length), and each one a log
    holds keeps that piece of the heap from being used again: a log of small events grew
    by that much per event, and the allocator faulted in fresh pages for every write. A
    copy costs a fraction of one page fault."""
    return _bytes(_view(encoded)) if type(encoded) is bytes else encoded


_bytes: Final = bytes
_view: Final = memoryview


@dataclass(slots=True)
class _Log:
    """One execution's log: entry ``i`` is the event of sequence ``first + i``
    (sequences are gapless; ``first`` moves when a prefix is truncated).

    Payloads and metadata are kept as the JSON text their check produced (in bytes of
    their own: see :func:`_kept`), so no caller can mutate what the store holds, and
    every read decodes a fresh copy. The metadata is
    the writer's; the fence is stamped into it on the way out.

    Each entry is a tuple of atomic values, which the garbage collector stops tracking
    the first time it sees one: a log costs the collector two objects (this one and its
    list) however long it grows, where a list per field cost it seven, each examined
    again by every full collection for as long as the store holds the log."""

    head: int = 0
    first: int = 0
    entries: list[_Entry] = field(default_factory=list)

    def index(self, sequence: int) -> int:
        """The list index of ``sequence``, clamped to the entries held."""
        return min(max(sequence - self.first, 0), len(self.entries))

    def event(self, execution_id: str, i: int) -> Event:
        kind, payload, encoded_metadata, fence, recorded, _ = self.entries[i]
        metadata = decode(encoded_metadata)
        assert isinstance(metadata, dict)
        if fence is not None:
            metadata["fence"] = fence
        return build_event(
            execution_id, self.first + i, kind, decode(payload), metadata, recorded
        )

    def extend(self, batch: CheckedEvents, fence: int | None, now: datetime) -> None:
        _, kinds, payloads, metadata, answering = batch._state
        self.entries += [
            (kind, _kept(payload), _kept(meta), fence, now, answers)
            for kind, payload, meta, answers in zip(
                kinds, payloads, metadata, answering, strict=True
            )
        ]
        self.head += len(kinds)

    def answered_after(self, i: int) -> bool:
        """Whether an entry from list index ``i`` on answers a park."""
        return any(entry[5] for entry in self.entries[i:])

    def prefix(self, head: int) -> _Log:
        """A new log of the sequences below ``head``: the entries this one holds of them
        (none when they were all truncated; its head is ``head`` all the same)."""
        return _Log(head, min(self.first, head), self.entries[: self.index(head)])

    def drop(self, cut: int) -> None:
        """Forget the first ``cut`` entries."""
        del self.entries[:cut]
        self.first += cut


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
        self._clock: Clock = clock or functools.partial(datetime.now, UTC)
        self._logs: dict[str, _Log] = {}
        self._fences: dict[str, int] = {}
        # The ids in order, sorted again only when the logs changed since (see _sorted_ids):
        # a listing that pages through n executions sorts them once, not once a page.
        self._ids: list[str] = []
        self._ids_stale = False
        # One signal per subscription waiting for its log to grow, each taken away when
        # its subscription stops waiting: one abandoned on a log never written again (a
        # finished execution's) leaves nothing behind.
        self._signals: dict[str, set[asyncio.Event]] = {}
        self._closed = False
        self._turns = 1  # calls left until the next yield: the first call yields

    @property
    def capabilities(self) -> frozenset[OptionalMethod]:
        return self._offered

    def _offers(self, method: OptionalMethod) -> None:
        """Refuse a method this instance does not offer. Whether it is open is checked
        after the arguments (by ``_tick``), as every store does: bad input is refused as
        bad input, closed or not."""
        if method not in self._offered:
            self._check_open()
            self._refuse(method, "not offered by this instance (MemoryEventStore(offer=...))")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("this in-memory event store")

    # -- internals ----------------------------------------------------------------------

    def _check_append(
        self, execution_id: str, expected_sequence: int, fence: int | None
    ) -> _Log | None:
        """The log an append at ``expected_sequence`` under ``fence`` extends (None: a
        new one), or the refusal."""
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
        return log

    def _written(
        self,
        execution_id: str,
        first: int,
        batch: CheckedEvents,
        copies: Copies | None,
        fence: int | None,
        now: datetime,
    ) -> tuple[Event, ...]:
        """The events an append of ``batch`` at ``first`` records. ``copies`` are fresh
        copies made by this call's own check (no caller holds them); without them (a
        batch checked above this store), each is decoded again."""
        if copies is None:
            _, _, payloads, metadatas, _ = batch._state
            copies = [
                (decode(payload), _object(decode(metadata)))
                for payload, metadata in zip(payloads, metadatas, strict=True)
            ]
        if fence is not None:
            for _, metadata in copies:
                metadata["fence"] = fence
        kinds = batch._state[1]
        if len(kinds) == 1:
            payload, metadata = copies[0]
            return (build_event(execution_id, first, kinds[0], payload, metadata, now),)
        return tuple(
            build_event(execution_id, first + i, kind, payload, metadata, now)
            for i, (kind, (payload, metadata)) in enumerate(zip(kinds, copies, strict=True))
        )

    def _commit(
        self,
        execution_id: str,
        log: _Log | None,
        batch: CheckedEvents,
        fence: int | None,
        now: datetime,
    ) -> None:
        if log is None:
            log = self._logs[execution_id] = _Log(0, 0, [])
        log.extend(batch, fence, now)
        if self._signals:
            self._wake(execution_id)

    def _write(
        self,
        execution_id: str,
        log: _Log | None,
        batch: CheckedEvents,
        copies: Copies | None,
        fence: int | None,
    ) -> tuple[Event, ...]:
        """Append a checked batch that ``_check_append`` accepted onto ``log``."""
        now = self._clock()
        written = self._written(
            execution_id, log.head if log else 0, batch, copies, fence, now
        )
        self._commit(execution_id, log, batch, fence, now)
        return written

    def _wake(self, execution_id: str) -> None:
        for signal in self._signals.pop(execution_id, ()):
            signal.set()

    async def _tick(self) -> None:
        # A yield every YIELD_EVERY calls (loom_core.memory.turns): tasks interleave
        # between store operations, never inside one. Closed is checked after the yield
        # too, so a call that raced close() is refused.
        if self._closed:
            self._check_open()
        self._turns -= 1
        if not self._turns:
            self._turns = YIELD_EVERY
            await one_turn()
            if self._closed:
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
        # This is the hottest call of the store: the common case of check_execution_id
        # and check_sequence is inlined (anything else goes to them, which decide and
        # word the refusal), and so are _tick(), _check_append's head check and, for one
        # event, _write.
        if not (
            type(execution_id) is str
            and 0 < len(execution_id) <= MAX_ID_BYTES
            and execution_id.isascii()
            and execution_id.isprintable()
        ):
            execution_id = check_execution_id(execution_id)
        single = _check_single(events)
        if single is None:
            batch, copies = _check_batch(events)
        if type(expected_sequence) is not int or not 0 <= expected_sequence <= MAX_POSITION:
            expected_sequence = check_sequence(expected_sequence, "expected_sequence")
        if fence is not None:
            fence = check_fence(fence)
        if self._closed:
            self._check_open()
        self._turns -= 1
        if not self._turns:
            self._turns = YIELD_EVERY
            await one_turn()
            if self._closed:
                self._check_open()
        log = self._logs.get(execution_id)
        if fence is not None or (log.head if log else 0) != expected_sequence:
            log = self._check_append(execution_id, expected_sequence, fence)
        if single is None:
            return self._write(execution_id, log, batch, copies, fence)
        now = self._clock()
        kind, payload, metadata, answering, payload_copy, metadata_copy = single
        if log is None:
            log = self._logs[execution_id] = _Log(0, 0, [])
        # _kept(), inlined for the payload; most metadata is the one shared b"{}".
        log.entries.append((
            kind,
            _bytes(_view(payload)) if type(payload) is bytes else payload,
            metadata if metadata is _EMPTY else _kept(metadata),
            fence,
            now,
            answering,
        ))
        log.head = expected_sequence + 1
        if self._signals:
            self._wake(execution_id)
        if fence is not None:
            metadata_copy["fence"] = fence
        # build_event(), inlined.
        event = _new(_UnfrozenEvent)
        event.execution_id = execution_id
        event.sequence = expected_sequence
        event.kind = kind
        event.payload = payload_copy
        event.metadata = metadata_copy
        event.recorded_at = now
        event.__class__ = Event  # type: ignore[assignment]
        return (event,)  # type: ignore[return-value]

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
        start = log.index(from_sequence)
        end = len(log.entries) if to_sequence is None else log.index(to_sequence + 1)
        if limit is not None:
            end = min(end, start + limit)
        return tuple(log.event(execution_id, i) for i in range(start, end))

    async def head(self, execution_id: str) -> int:
        execution_id = check_execution_id(execution_id)
        await self._tick()
        log = self._logs.get(execution_id)
        return log.head if log else 0

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        if after is not None:
            after = check_key(after, "after")
        limit = check_limit(limit)
        await self._tick()
        ids = self._sorted_ids()
        start = 0 if after is None else bisect.bisect_right(ids, after)
        return tuple(ids[start : start + limit])

    def _sorted_ids(self) -> list[str]:
        # Logs are only ever added (an append, a copy) between deletions, and a deletion
        # marks the list stale: the count tells whether one was added since the last sort,
        # so the append path pays nothing for it.
        if self._ids_stale or len(self._ids) != len(self._logs):
            self._ids = sorted(self._logs)
            self._ids_stale = False
        return self._ids

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
        if log.answered_after(log.index(park_seq + 1)):
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
        execution_id = check_execution_id(execution_id)
        batch, copies = _check_batch(events)
        expected_sequence = check_sequence(expected_sequence, "expected_sequence")
        observed_fence = check_fence(observed_fence, "observed_fence")
        await self._tick()
        current = self._fences.get(execution_id, 0)
        if current != observed_fence:
            raise StaleFenceError(execution_id, observed_fence, current)
        log = self._check_append(execution_id, expected_sequence, None)
        return self._write(execution_id, log, batch, copies, None)

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        self._offers("append_many")
        checked = check_append_requests(requests)
        await self._tick()
        logs = [
            self._check_append(r.execution_id, r.expected_sequence, r.fence) for r, _ in checked
        ]
        now = self._clock()
        written = [
            self._written(
                r.execution_id, log.head if log else 0, _batch_of(r),
                [(e.payload, dict(e.metadata)) for e in events], r.fence, now,
            )
            for (r, events), log in zip(checked, logs, strict=True)
        ]
        for (r, _), log in zip(checked, logs, strict=True):
            self._commit(r.execution_id, log, _batch_of(r), r.fence, now)
        return tuple(written)

    async def delete_execution(self, execution_id: str) -> bool:
        self._offers("delete_execution")
        execution_id = check_execution_id(execution_id)
        await self._tick()
        if self._logs.pop(execution_id, None) is None:
            return False
        self._ids_stale = True
        # The token moves one past its current value: whoever held it, the runner of the
        # deleted log included, is stale on a re-created one (docs/design.md, "Deleting a
        # log fences out its writers").
        self._fences[execution_id] = self._fences.get(execution_id, 0) + 1
        return True

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
        copy = log.prefix(through_sequence + 1)
        self._logs[target] = copy
        self._wake(target)
        return len(copy.entries)

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
        cut = log.index(keep_from_sequence)
        log.drop(cut)
        return cut

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        self._offers("subscribe")
        execution_id = check_execution_id(execution_id)
        from_sequence = check_sequence(from_sequence, "from_sequence")
        self._check_open()
        return self._follow(execution_id, from_sequence)

    async def _follow(self, execution_id: str, next_sequence: int) -> AsyncIterator[Event]:
        while not self._closed:
            log = self._logs.get(execution_id)
            if log is not None and next_sequence < log.head:
                # One event per pass, the log looked up again after each yield: the
                # consumer may have appended, truncated or deleted meanwhile.
                start = log.index(next_sequence)
                if start < len(log.entries):
                    event = log.event(execution_id, start)
                    next_sequence = event.sequence + 1
                    yield event
                    continue
            signal = asyncio.Event()
            self._signals.setdefault(execution_id, set()).add(signal)
            try:
                await signal.wait()
            finally:
                waiting = self._signals.get(execution_id)
                if waiting is not None:
                    waiting.discard(signal)
                    if not waiting:
                        del self._signals[execution_id]


_new: Final = object.__new__


def _batch_of(request: AppendRequest) -> CheckedEvents:
    # check_append_requests returns every request's events as a CheckedEvents.
    assert isinstance(request.events, CheckedEvents)
    return request.events
