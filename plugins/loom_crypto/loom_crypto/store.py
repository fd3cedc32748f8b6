"""The sealing decorator: payloads go to the inner store sealed and come back opened.

Which subject an event belongs to is the application's answer (``subject_of``); each
subject's payloads are sealed under that subject's data key, so destroying one key
(:func:`~loom_crypto.shred_subject`) erases exactly that subject's payloads.

The optional methods, decided (a decision is the class's own, see ``decisions`` below):

- ``acquire_fence``, ``acquire_fence_if``: forwarded; they read only kinds and fences,
  which stay plaintext.
- ``append_if_unchanged``, ``append_many``: sealed like ``append``, then forwarded.
- ``subscribe``: forwarded and opened event by event.
- ``delete_execution``: forwarded; it removes ciphertext and touches no key (the subject
  may own other logs).
- ``truncate_prefix_keeping``: forwarded; kept events keep their sequences, so their
  associated data still matches.
- ``copy_prefix``: refused. Each ciphertext is bound to its execution id, so a byte copy
  would not open under the target, and a re-sealed copy written through ``append`` could not
  keep the source's fence stamps, ``recorded_at`` or a truncated start, which the contract
  promises. Branch by reading the prefix through this decorator and appending it to the
  new execution: it is sealed for the target then.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeAlias

from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Implement, Refuse
from loom_core.errors import InvalidInputError, InvalidOptionError, PayloadShreddedError
from loom_core.events import Event, NewEvent
from loom_core.spi import AppendRequest, EventStore
from loom_core.validation import (
    check_append,
    check_append_requests,
    check_fence,
    check_key,
)
from loom_crypto.errors import KeyDestroyedError
from loom_crypto.keys import DataKey, KeyStore
from loom_crypto.sealing import (
    is_sealed,
    open_payload,
    parse_sealed,
    refuse_reserved,
    seal_payload,
)

__all__ = ["CryptoEventStore", "SubjectOf", "subject_is_execution"]

SubjectOf: TypeAlias = Callable[[str, NewEvent], str | None]
"""``subject_of(execution_id, event)``: the subject whose key seals ``event``, or ``None``
to store that event's payload in plaintext (it holds nothing personal)."""


def subject_is_execution(execution_id: str, event: NewEvent) -> str:
    """The simplest ``subject_of``: every execution is its own subject."""
    return execution_id


class CryptoEventStore(EventStoreDecorator):
    """Seals payloads under per-subject AES-256-GCM keys from ``key_store``.

    Reading a payload whose key was destroyed raises
    :class:`~loom_core.PayloadShreddedError` (its ``__cause__`` is the key store's
    :class:`~loom_crypto.KeyDestroyedError`); a payload that does not open for its event
    raises :class:`~loom_crypto.PayloadAuthenticationError`. :meth:`read_sealed` reads
    kinds, sequences and metadata without any key.
    """

    def __init__(self, inner: EventStore, *, key_store: KeyStore, subject_of: SubjectOf) -> None:
        if not isinstance(key_store, KeyStore):
            raise InvalidOptionError(
                f"key_store must implement loom_crypto.KeyStore, got {type(key_store).__name__}"
            )
        if not callable(subject_of):
            raise InvalidOptionError("subject_of must be a callable (execution_id, event)")
        super().__init__(inner)
        self.key_store = key_store
        self._subject_of = subject_of

    # -- sealing -------------------------------------------------------------------------

    def _subjects(self, execution_id: str, events: Sequence[NewEvent]) -> list[str | None]:
        """Every event's subject, asked before any key is created, so a refused batch
        leaves the key store as it was."""
        subjects: list[str | None] = []
        for i, event in enumerate(events):
            refuse_reserved(event.payload, f"events[{i}]")
            subject = self._subject_of(execution_id, event)
            if subject is not None:
                try:
                    subject = check_key(subject, "subject")
                except InvalidInputError as exc:
                    raise InvalidOptionError(
                        f"subject_of returned {subject!r} for events[{i}] of "
                        f"{execution_id!r}: {exc}"
                    ) from None
            subjects.append(subject)
        return subjects

    async def _seal(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        subjects: Sequence[str | None],
        first_sequence: int,
    ) -> tuple[list[NewEvent], list[bytes | None]]:
        """The events as the inner store gets them, and each sealed plaintext (None for an
        event stored in plaintext)."""
        keys: dict[str, DataKey] = {}
        sealed: list[NewEvent] = []
        plaintexts: list[bytes | None] = []
        for offset, (event, subject) in enumerate(zip(events, subjects, strict=True)):
            if subject is None:
                sealed.append(event)
                plaintexts.append(None)
                continue
            key = keys.get(subject)
            if key is None:
                key = keys[subject] = await self.key_store.create(subject)
            payload, plaintext = seal_payload(
                key,
                event.payload,
                execution_id=execution_id,
                sequence=first_sequence + offset,
                kind=event.kind,
            )
            sealed.append(NewEvent(event.kind, payload, event.metadata))
            plaintexts.append(plaintext)
        return sealed, plaintexts

    async def _prepare(
        self, execution_id: str, events: Sequence[NewEvent], first_sequence: int
    ) -> tuple[list[NewEvent], list[bytes | None]]:
        subjects = self._subjects(execution_id, events)
        return await self._seal(execution_id, events, subjects, first_sequence)

    async def _open(self, event: Event, keys: dict[str, DataKey]) -> Event:
        payload = event.payload
        if not isinstance(payload, dict) or not is_sealed(payload):
            return event
        sealed = parse_sealed(payload, execution_id=event.execution_id, sequence=event.sequence)
        key = keys.get(sealed.key_id)
        if key is None:
            try:
                key = await self.key_store.get(sealed.key_id)
            except KeyDestroyedError as exc:
                raise PayloadShreddedError(
                    event.execution_id, event.sequence, sealed.key_id
                ) from exc
            keys[sealed.key_id] = key
        opened = open_payload(
            key,
            sealed,
            execution_id=event.execution_id,
            sequence=event.sequence,
            kind=event.kind,
        )
        return dataclasses.replace(event, payload=opened)

    async def _open_all(self, events: Sequence[Event]) -> tuple[Event, ...]:
        # One key lookup per key id per call; never cached across calls, so a key destroyed
        # by another process is noticed on the next read.
        keys: dict[str, DataKey] = {}
        return tuple([await self._open(event, keys) for event in events])

    # -- required ------------------------------------------------------------------------

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        """Seal each payload for the sequence it will take (``expected_sequence + i``) and
        append. A subject whose key was destroyed is refused
        (:class:`~loom_crypto.KeyDestroyedError`) before anything is written."""
        execution_id, checked, expected_sequence = check_append(
            execution_id, events, expected_sequence
        )
        if fence is not None:
            fence = check_fence(fence)
        sealed, plaintexts = await self._prepare(execution_id, checked, expected_sequence)
        written = await self.inner.append(
            execution_id, sealed, expected_sequence=expected_sequence, fence=fence
        )
        return _as_written(written, plaintexts)

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        events = await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )
        return await self._open_all(events)

    async def read_sealed(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        """The events as stored: sealed payloads stay sealed. Needs no key, so it reads the
        kinds, sequences, fences and metadata of a shredded log."""
        return await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )

    # -- optional ------------------------------------------------------------------------

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
        sealed, plaintexts = await self._prepare(execution_id, checked, expected_sequence)
        written = await self.inner.append_if_unchanged(
            execution_id, sealed, expected_sequence=expected_sequence,
            observed_fence=observed_fence,
        )
        return _as_written(written, plaintexts)

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        checked = check_append_requests(requests)
        subjects = [self._subjects(r.execution_id, events) for r, events in checked]
        sealed_requests: list[AppendRequest] = []
        all_plaintexts: list[list[bytes | None]] = []
        for (request, events), batch_subjects in zip(checked, subjects, strict=True):
            sealed, plaintexts = await self._seal(
                request.execution_id, events, batch_subjects, request.expected_sequence
            )
            sealed_requests.append(dataclasses.replace(request, events=tuple(sealed)))
            all_plaintexts.append(plaintexts)
        written = await self.inner.append_many(sealed_requests)
        return tuple(
            _as_written(batch, plaintexts)
            for batch, plaintexts in zip(written, all_plaintexts, strict=True)
        )

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        """The inner subscription, each event opened as it arrives; a shredded payload
        ends it with :class:`~loom_core.PayloadShreddedError`."""
        return self._opening(self.inner.subscribe(execution_id, from_sequence=from_sequence))

    async def _opening(self, source: AsyncIterator[Event]) -> AsyncIterator[Event]:
        try:
            async for event in source:
                yield await self._open(event, {})
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=Implement(append_if_unchanged, requires=("append_if_unchanged",)),
        append_many=Implement(append_many, requires=("append_many",)),
        delete_execution=FORWARD,
        copy_prefix=Refuse(
            "sealed payloads are bound to their execution id, so a copied ciphertext would "
            "not open under the target; branch by reading the prefix through the crypto "
            "decorator and appending it to the target, which seals it for the target"
        ),
        truncate_prefix_keeping=FORWARD,
        subscribe=Implement(subscribe, requires=("subscribe",)),
    )


def _as_written(written: Sequence[Event], plaintexts: Sequence[bytes | None]) -> tuple[Event, ...]:
    """The stored events with the payloads the caller wrote (as a read would return them)."""
    return tuple(
        event if plaintext is None else dataclasses.replace(event, payload=json.loads(plaintext))
        for event, plaintext in zip(written, plaintexts, strict=True)
    )
