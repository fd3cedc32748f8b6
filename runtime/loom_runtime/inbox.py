"""Messages waiting for an execution: the reserved stream ``$inbox:<id>``.

A message is durable once :meth:`Inbox.put` returns: it is an event of the inbox stream,
and its sequence there is its id. Delivery never moves it: the receiver's log records the
consumption (MESSAGE_CONSUMED names the inbox sequence), so "consumed" is a fact of the
receiver's log, written under the receiver's fence, and a message is delivered once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence, Set
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, final

from loom_core import (
    ConflictError,
    Event,
    EventStore,
    ExecutionAlreadyExistsError,
    JsonValue,
    SequenceConflictError,
)
from loom_runtime.records import MESSAGE_KIND, inbox_of, message

__all__ = ["Cursor", "Inbox", "Message"]

_CACHE_SIZE: Final = 1024
_PUT_ATTEMPTS: Final = 32
_TICK: Final = timedelta(microseconds=1)
_READS: Final = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Message:
    sequence: int
    topic: str
    value: JsonValue
    key: str | None
    wake_at: datetime | None = None
    """The instant of the wake row its sender wrote before storing it (None when the
    message was stored without one: handed on to a successor that had not run yet)."""


def _message(event: Event) -> Message | None:
    payload = event.payload
    if event.kind != MESSAGE_KIND or not isinstance(payload, dict):
        return None
    topic = payload.get("topic")
    key = payload.get("key")
    if not isinstance(topic, str):
        return None
    wake_at = payload.get("wake_at")
    return Message(
        event.sequence,
        topic,
        payload.get("value"),
        key if isinstance(key, str) else None,
        datetime.fromisoformat(wake_at) if isinstance(wake_at, str) else None,
    )


@final
class _Read:
    """What was read of one inbox stream, with its messages indexed by topic, by key and
    by the wake instant each names, so that a receive, a keyed send and a sender's claim
    each cost what they find rather than a pass over every message stored."""

    __slots__ = ("head", "keys", "last_at", "messages", "named", "serial", "stepped", "topics")

    def __init__(self) -> None:
        self.head = 0
        self.last_at: datetime | None = None
        self.messages: list[Message] = []
        self.topics: dict[str, list[Message]] = {}
        self.keys: dict[str, Message] = {}
        self.named: set[datetime] = set()
        # For an instant a sender asked for and found named: the instant it was given,
        # every instant between being named too (named only grows), so the next sender
        # asking for it steps on from there rather than past every one again.
        self.stepped: dict[datetime, datetime] = {}
        self.serial = next(_READS)

    def add(self, events: Sequence[Event]) -> None:
        """Take in ``events``, read from the stream in order; those it already holds (a
        concurrent read took them in first) are skipped."""
        for event in events:
            if event.sequence < self.head:
                continue
            self.head = event.sequence + 1
            self.last_at = event.recorded_at
            m = _message(event)
            if m is None:
                continue
            self.messages.append(m)
            self.topics.setdefault(m.topic, []).append(m)
            if m.key is not None:
                self.keys.setdefault(m.key, m)  # a key names the first message stored with it
            if m.wake_at is not None:
                self.named.add(m.wake_at)

    def free_before(self, at: datetime) -> datetime:
        """The nearest instant at or before ``at`` that no message names."""
        asked = at
        at = self.stepped.get(asked, at)
        while at in self.named:
            at -= _TICK
        self.stepped[asked] = at
        return at


@final
class Cursor:
    """How far one receiver has gone through its inbox: for each topic, how many of its
    messages, oldest first, it has found among those it consumed. It serves one set of
    consumed messages that only grows (a run's own), and starts over when the inbox is
    read anew (deleted since); for any other set, pass none."""

    __slots__ = ("_passed", "_serial")

    def __init__(self) -> None:
        self._serial = 0
        self._passed: dict[str, int] = {}


@final
class Inbox:
    """Reads and writes inbox streams; keeps what it read. A stream only grows, unless it
    is deleted (an execution pruned) and its id used again: each read takes the last event
    it knew again, and reads the stream anew when that is not the one it knew."""

    __slots__ = ("_cache", "_events", "_putting")

    def __init__(self, events: EventStore) -> None:
        self._events = events
        self._cache: OrderedDict[str, _Read] = OrderedDict()
        # One put at a time per inbox in this process, and how many wait for it: the
        # senders of one process queue rather than race each other for the next sequence
        # (only other processes' senders make a put try again).
        self._putting: dict[str, tuple[asyncio.Lock, int]] = {}

    async def _read(self, stream: str) -> _Read:
        """What is stored in ``stream``, brought up to date by reading what was appended
        since the last read. What was known stays in the cache while the tail is read, so
        a read beside it (a receive beside a send) reads a tail too, not the stream whole."""
        known = self._cache.get(stream)
        if known is not None and known.head:
            head, last_at = known.head, known.last_at
            tail = await self._events.read(stream, from_sequence=head - 1)
            if tail and tail[0].sequence == head - 1 and tail[0].recorded_at == last_at:
                current = self._cache.get(stream)
                if current is None or current is known:
                    known.add(tail[1:])
                    current = known
                # else another read found the stream anew meanwhile: its view is the later
                self._keep(stream, current)
                return current
            # Deleted since (and perhaps written again): what was known is gone.
        read = _Read()
        read.add(await self._events.read(stream))
        self._keep(stream, read)
        return read

    def _keep(self, stream: str, read: _Read) -> None:
        self._cache[stream] = read
        self._cache.move_to_end(stream)
        while len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)

    async def messages(self, execution_id: str) -> list[Message]:
        """Every message sent to ``execution_id``, in the order they were stored."""
        return list((await self._read(inbox_of(execution_id))).messages)

    async def names(self, execution_id: str, wake_at: datetime) -> bool:
        """Whether a message sent to ``execution_id`` names the wake row at ``wake_at``."""
        return wake_at in (await self._read(inbox_of(execution_id))).named

    def forget(self, execution_id: str) -> None:
        """Drop what was read of ``execution_id``'s inbox: its execution ended, and no
        receive reads it again (a later read, a send's, reads the stream anew)."""
        if self._cache:
            self._cache.pop(inbox_of(execution_id), None)

    async def next(
        self,
        execution_id: str,
        topics: tuple[str, ...],
        consumed: Set[int],
        cursor: Cursor | None = None,
    ) -> Message | None:
        """The oldest message on any of ``topics`` that is not in ``consumed``. With
        ``cursor`` (the receiver's own, for a ``consumed`` that only grows), the messages
        it found consumed before are not looked at again."""
        read = await self._read(inbox_of(execution_id))
        passed: dict[str, int] = {}
        if cursor is not None:
            if cursor._serial != read.serial:
                cursor._serial, cursor._passed = read.serial, {}
            passed = cursor._passed
        found: Message | None = None
        for topic in topics:
            listed = read.topics.get(topic)
            if listed is None:
                continue
            i = passed.get(topic, 0)
            while i < len(listed) and listed[i].sequence in consumed:
                i += 1
            if cursor is not None:
                passed[topic] = i
            if i < len(listed) and (found is None or listed[i].sequence < found.sequence):
                found = listed[i]
        return found

    async def put(
        self,
        execution_id: str,
        topic: str,
        value: JsonValue,
        key: str | None,
        *,
        wake_at: datetime | None = None,
        claim: Callable[[datetime], Awaitable[None]] | None = None,
    ) -> Message:
        """Store a message durably; a second put with the same ``key`` returns the first.
        ``wake_at`` names the wake row the sender wrote for it. With ``claim``, the row is
        the sender's alone: when a stored message already names that instant (another
        sender whose clock read the same), the message names the nearest earlier instant
        none names, and ``claim`` writes its row before the message is stored (see
        docs/design.md, "Resuming a park")."""
        stream = inbox_of(execution_id)
        lock, users = self._putting.get(stream) or (asyncio.Lock(), 0)
        self._putting[stream] = (lock, users + 1)
        try:
            async with lock:
                return await self._put(
                    execution_id, stream, topic, value, key, wake_at, claim
                )
        finally:
            lock, users = self._putting[stream]
            if users == 1:
                del self._putting[stream]
            else:
                self._putting[stream] = (lock, users - 1)

    async def _put(
        self,
        execution_id: str,
        stream: str,
        topic: str,
        value: JsonValue,
        key: str | None,
        wake_at: datetime | None,
        claim: Callable[[datetime], Awaitable[None]] | None,
    ) -> Message:
        for _ in range(_PUT_ATTEMPTS):
            read = await self._read(stream)
            head = read.head
            if key is not None:
                existing = read.keys.get(key)
                if existing is not None:
                    return existing
            if claim is not None and wake_at is not None and wake_at in read.named:
                wake_at = read.free_before(wake_at)
                await claim(wake_at)
            try:
                written = await self._events.append(
                    stream, [message(topic, value, key, wake_at)], expected_sequence=head
                )
            except (SequenceConflictError, ExecutionAlreadyExistsError):
                continue  # another sender got there first: re-read, then decide again
            stored = _message(written[0])
            assert stored is not None
            return stored
        raise ConflictError(
            f"could not store a message for {execution_id!r}: senders of other "
            f"processes got in first {_PUT_ATTEMPTS} times in a row; send again (with key= it "
            "is idempotent)"
        )
