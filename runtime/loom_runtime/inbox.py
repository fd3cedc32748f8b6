"""Messages waiting for an execution: the reserved stream ``$inbox:<id>``.

A message is durable once :meth:`Inbox.put` returns: it is an event of the inbox stream,
and its sequence there is its id. Delivery never moves it: the receiver's log records the
consumption (MESSAGE_CONSUMED names the inbox sequence), so "consumed" is a fact of the
receiver's log, written under the receiver's fence, and a message is delivered once.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Set
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

__all__ = ["Inbox", "Message"]

_CACHE_SIZE: Final = 1024
_PUT_ATTEMPTS: Final = 32
_TICK: Final = timedelta(microseconds=1)


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
class Inbox:
    """Reads and writes inbox streams; keeps what it read. A stream only grows, unless it
    is deleted (an execution pruned) and its id used again: each read takes the last event
    it knew again, and reads the stream anew when that is not the one it knew."""

    __slots__ = ("_cache", "_events", "_putting")

    def __init__(self, events: EventStore) -> None:
        self._events = events
        self._cache: OrderedDict[str, tuple[int, list[Message], datetime | None]] = (
            OrderedDict()
        )
        # One put at a time per inbox in this process, and how many wait for it: the
        # senders of one process queue rather than race each other for the next sequence
        # (only other processes' senders make a put try again).
        self._putting: dict[str, tuple[asyncio.Lock, int]] = {}

    async def messages(self, execution_id: str) -> list[Message]:
        """Every message sent to ``execution_id``, in the order they were stored."""
        stream = inbox_of(execution_id)
        head, known, last_at = self._cache.pop(stream, (0, [], None))
        if head:
            tail = await self._events.read(stream, from_sequence=head - 1)
            if tail and tail[0].sequence == head - 1 and tail[0].recorded_at == last_at:
                tail = tail[1:]
            else:  # deleted since (and perhaps written again): what was known is gone
                head, known = 0, []
                tail = await self._events.read(stream)
        else:
            tail = await self._events.read(stream)
        if tail:
            known = [*known, *(m for e in tail if (m := _message(e)) is not None)]
            head = tail[-1].sequence + 1
            last_at = tail[-1].recorded_at
        self._cache[stream] = (head, known, last_at)
        while len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return known

    def forget(self, execution_id: str) -> None:
        """Drop what was read of ``execution_id``'s inbox: its execution ended, and no
        receive reads it again (a later read, a send's, reads the stream anew)."""
        if self._cache:
            self._cache.pop(inbox_of(execution_id), None)

    async def next(
        self, execution_id: str, topics: tuple[str, ...], consumed: Set[int]
    ) -> Message | None:
        """The oldest message on any of ``topics`` that is not in ``consumed``."""
        for candidate in await self.messages(execution_id):
            if candidate.topic in topics and candidate.sequence not in consumed:
                return candidate
        return None

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
            known = await self.messages(execution_id)
            head = self._cache[stream][0]
            if key is not None:
                for existing in known:
                    if existing.key == key:
                        return existing
            if claim is not None and wake_at is not None:
                named = {m.wake_at for m in known}
                if wake_at in named:
                    while wake_at in named:
                        wake_at -= _TICK
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
