"""The sealing decorator: payloads go to the inner store sealed (or authenticated in the
clear) and come back opened, and only if this decorator wrote them for that very event.

Which subject an event belongs to is the application's answer (``subject_of``); each
subject's payloads are sealed under that subject's data key, so destroying one key
(:func:`~loom_crypto.shred_subject`) erases exactly that subject's payloads.

**The incarnation.** Deleting an execution and re-creating its id gives a new log with the
same ids, sequences and kinds, so (execution, sequence, kind, key) alone cannot tell a row
of the old log from one of the new. The decorator draws a random incarnation id whenever it
writes sequence 0 (``expected_sequence == 0``), stamps it in the metadata of every event of
the log (``metadata["$loom_incarnation"]``) and binds it into every payload's associated
data or MAC. An append at ``expected_sequence > 0`` continues the log's incarnation: from
memory when one of this decorator's own appends landed under a token the store will check
for it (an unfenced append is sent as ``append_if_unchanged`` under that token;
:mod:`loom_crypto.incarnations` says why that is safe), else by reading the log's first
stored event (one extra read of one row). A read checks that every event it returns
carries the incarnation of the log's first stored event, sequence 0 or, after
``truncate_prefix_keeping``, the first kept one (read along with a range that starts at 0,
one extra row otherwise), and that each payload authenticates under the incarnation its own
metadata names. So a payload pasted from a deleted log under a new row fails its tag or
MAC, and a whole row (payload and metadata) copied back fails the incarnation check
(:class:`~loom_crypto.IncarnationMismatchError`). Stamping every event, not only sequence
0, is what keeps a compacted log checkable: the first kept event carries the incarnation.

What no per-event check can see: the *whole* retained log replaced by a deleted one's rows
(that is a rollback; the audit chain's exported head detects it), or a read confined to a
prefix of the log whose rows were all replaced, first event included (any read that also
covers an untouched event refuses). A log compacted to nothing has no anchor left: its next
append starts a new incarnation.

The optional methods, decided (a decision is the class's own, see ``decisions`` below):

- ``acquire_fence``, ``acquire_fence_if``: forwarded; they read only kinds and fences,
  which stay plaintext.
- ``append_if_unchanged``, ``append_many``: sealed like ``append``, then forwarded.
- ``subscribe``: forwarded and opened event by event.
- ``delete_execution``: forwarded; it removes ciphertext and touches no key (the subject
  may own other logs).
- ``truncate_prefix_keeping``: forwarded; kept events keep their sequences and their
  incarnation stamp, so their associated data still matches, and the first kept event
  becomes the log's incarnation anchor.
- ``copy_prefix``: refused. Each ciphertext is bound to its execution id, so a byte copy
  would not open under the target, and a re-sealed copy written through ``append`` could not
  keep the source's fence stamps, ``recorded_at`` or a truncated start, which the contract
  promises. Branch by reading the prefix through this decorator and appending it to the
  new execution: it is sealed for the target then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final, TypeAlias

from loom_core import Event, JsonObject, JsonValue, LoomError, NewEvent
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Implement, Refuse
from loom_core.errors import (
    InvalidInputError,
    InvalidOptionError,
    PayloadShreddedError,
    StaleFenceError,
)
from loom_core.spi import (
    AppendRequest,
    EventStore,
    build_event,
    build_new_event,
    check_append_requests,
    check_events_with_text,
    check_execution_id,
    check_fence,
    check_key,
    check_sequence,
)
from loom_crypto.errors import (
    IncarnationMismatchError,
    KeyDestroyedError,
    KeyStoreError,
    PayloadAuthenticationError,
    UnauthenticatedPayloadError,
)
from loom_crypto.incarnations import DEFAULT_INCARNATION_CACHE_SIZE, Incarnations
from loom_crypto.keys import KEY_BYTES, DataKey, KeyStore, ask_key_store, key_store_lacks
from loom_crypto.sealing import (
    INCARNATION_FIELD,
    INTEGRITY_SUBJECT,
    Sealed,
    authenticate_clear,
    is_clear,
    is_sealed,
    new_incarnation,
    open_clear,
    open_payload,
    parse_clear,
    parse_sealed,
    refuse_reserved,
    seal_payload,
)

__all__ = ["CryptoEventStore", "SubjectOf", "subject_is_execution"]

SubjectOf: TypeAlias = Callable[[str, NewEvent], str | None]
"""``subject_of(execution_id, event)``: the subject whose key seals ``event``, or ``None``
to store that event's payload in the clear (it holds nothing personal; it is still
authenticated)."""

LEGACY_INCARNATION: Final = ""
"""The incarnation of events appended, under ``legacy_reads=True``, to a log written by
loom-crypto 0.1 (which has none to continue)."""

_Keys: TypeAlias = dict[str, DataKey]


def subject_is_execution(execution_id: str, event: NewEvent) -> str:
    """The simplest ``subject_of``: every execution is its own subject."""
    return execution_id




class CryptoEventStore(EventStoreDecorator):
    """Seals payloads under per-subject AES-256-GCM keys from ``key_store`` and
    authenticates clear ones under the key store's integrity key.

    Reading a payload whose key was destroyed raises
    :class:`~loom_core.PayloadShreddedError` (its ``__cause__`` is the key store's
    :class:`~loom_crypto.KeyDestroyedError`); a payload this decorator did not write for
    its event, in this incarnation of the log, raises
    :class:`~loom_crypto.PayloadAuthenticationError` (or its subclasses
    :class:`~loom_crypto.IncarnationMismatchError` and
    :class:`~loom_crypto.UnauthenticatedPayloadError`). :meth:`read_sealed` reads kinds,
    sequences and metadata without any key.

    ``legacy_reads=True`` also reads logs written by loom-crypto 0.1 (format 1), with 0.1's
    guarantees only: their clear payloads are not authenticated and they carry no
    incarnation. Off by default, because while it is on a row replaced in plaintext reads
    as genuine in any log whose first event was stripped of its incarnation.

    ``incarnation_cache_size`` (an int >= 0) is how many executions' incarnations are
    remembered to spare appends the read of the log's first event; 0 remembers none.
    """

    def __init__(
        self,
        inner: EventStore,
        *,
        key_store: KeyStore,
        subject_of: SubjectOf,
        legacy_reads: bool = False,
        incarnation_cache_size: int = DEFAULT_INCARNATION_CACHE_SIZE,
    ) -> None:
        lacking = key_store_lacks(key_store)
        if lacking:
            raise InvalidOptionError(
                f"key_store must implement loom_crypto.KeyStore, got "
                f"{type(key_store).__name__}, which lacks {', '.join(lacking)}"
            )
        if not callable(subject_of):
            raise InvalidOptionError("subject_of must be a callable (execution_id, event)")
        if not isinstance(legacy_reads, bool):
            raise InvalidOptionError(
                f"legacy_reads must be a bool, got {type(legacy_reads).__name__}"
            )
        if (
            not isinstance(incarnation_cache_size, int)
            or isinstance(incarnation_cache_size, bool)
            or incarnation_cache_size < 0
        ):
            raise InvalidOptionError(
                "incarnation_cache_size must be an int >= 0 (executions remembered), "
                f"not {incarnation_cache_size!r}"
            )
        super().__init__(inner)
        self.key_store = key_store
        self._subject_of = subject_of
        self._legacy_reads = legacy_reads
        # The integrity key is never destroyed (shred_subject refuses its subject), so it is
        # safe to keep for the life of the decorator.
        self._integrity: DataKey | None = None
        self._incarnations = Incarnations(incarnation_cache_size)

    # -- keys ----------------------------------------------------------------------------

    async def _integrity_key(self) -> DataKey:
        """The integrity key, created on first use."""
        if self._integrity is None:
            self._integrity = await ask_key_store(
                self.key_store.create(INTEGRITY_SUBJECT), "create the integrity key"
            )
        return self._integrity

    async def _integrity_key_named(self, key_id: str, event: Event) -> DataKey:
        """The integrity key, if ``key_id`` names it; never creates one (a read does not)."""
        key = self._integrity
        if key is None:
            existing = await ask_key_store(
                self.key_store.key_id_for(INTEGRITY_SUBJECT), "look up the integrity key"
            )
            if existing is not None:
                key = self._integrity = await ask_key_store(
                    self.key_store.get(existing), f"get the integrity key {existing!r}"
                )
        if key is None or key.key_id != key_id:
            raise PayloadAuthenticationError(
                event.execution_id, event.sequence, key_id,
                "its key id is not the integrity key of this key store",
            )
        return key

    async def _subject_key(self, sealed: Sealed, event: Event, keys: _Keys) -> DataKey:
        key = keys.get(sealed.key_id)
        if key is None:
            try:
                key = await ask_key_store(
                    self.key_store.get(sealed.key_id),
                    f"get key {sealed.key_id!r} for {event.execution_id!r}",
                )
            except KeyDestroyedError as exc:
                raise PayloadShreddedError(
                    event.execution_id, event.sequence, sealed.key_id
                ) from exc
            keys[sealed.key_id] = key
        return key

    # -- writing -------------------------------------------------------------------------

    def _subjects(self, execution_id: str, events: Sequence[NewEvent]) -> list[str | None]:
        """Every event's subject, asked before any key is created, so a refused batch
        leaves the key store as it was."""
        subjects: list[str | None] = []
        for i, event in enumerate(events):
            refuse_reserved(event.payload, event.metadata, f"events[{i}]")
            try:
                subject = self._subject_of(execution_id, event)
            except LoomError:
                raise
            except Exception as exc:
                raise InvalidOptionError(
                    f"subject_of raised {type(exc).__name__}: {exc} for events[{i}] of "
                    f"{execution_id!r}; nothing was written"
                ) from exc
            if subject is not None:
                try:
                    subject = check_key(subject, "subject")
                except InvalidInputError as exc:
                    raise InvalidOptionError(
                        f"subject_of returned {subject!r} for events[{i}] of "
                        f"{execution_id!r}: {exc}"
                    ) from None
                if subject == INTEGRITY_SUBJECT:
                    raise InvalidOptionError(
                        f"subject_of returned the reserved subject {INTEGRITY_SUBJECT!r} for "
                        f"events[{i}] of {execution_id!r}; its key authenticates clear payloads"
                    )
            subjects.append(subject)
        return subjects

    async def _log_incarnation_for_append(
        self, execution_id: str, expected_sequence: int
    ) -> str | None:
        """The incarnation an append at ``expected_sequence`` continues; ``None`` for a log
        written by loom-crypto 0.1 (no incarnation)."""
        if expected_sequence == 0:
            return new_incarnation()
        first = await self.inner.read(execution_id, limit=1)
        if not first:
            # No event retained: the append is wrong (the inner store refuses it), or the
            # log was compacted to nothing, which leaves no incarnation to continue.
            return new_incarnation()
        return _incarnation_of(first[0])

    async def _incarnation_for_append(
        self, execution_id: str, expected_sequence: int, guarded_by: int | None
    ) -> str:
        """The incarnation an append at ``expected_sequence`` that the store accepts only
        under the token ``guarded_by`` (None: no token check) writes."""
        if expected_sequence > 0 and guarded_by is not None:
            known = self._incarnations.under(execution_id, guarded_by)
            if known is not None:
                return known
        incarnation = await self._log_incarnation_for_append(execution_id, expected_sequence)
        if incarnation is not None:
            return incarnation
        if self._legacy_reads:
            return LEGACY_INCARNATION
        raise _legacy_log(execution_id, (await self.inner.read(execution_id, limit=1))[0])

    async def _seal(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        subjects: Sequence[str | None],
        first_sequence: int,
        incarnation: str,
        texts: Sequence[str] | None = None,
    ) -> tuple[list[NewEvent], list[JsonValue]]:
        """The events as the inner store gets them, and each one's payload as the caller
        gave it (what a read gives back). ``events`` are the check's fresh copies (or the
        decorator's own markers), so no caller holds those payloads; ``texts``, when
        given, are their JSON texts as the check wrote them, sealed as they are."""
        keys: _Keys = {}
        stored: list[NewEvent] = []
        values: list[JsonValue] = []
        for offset, (event, subject) in enumerate(zip(events, subjects, strict=True)):
            if subject is None:
                key, protect = await self._integrity_key(), authenticate_clear
            else:
                known = keys.get(subject)
                if known is None:
                    known = keys[subject] = await ask_key_store(
                        self.key_store.create(subject),
                        f"create or get a subject's key for {execution_id!r}",
                    )
                key, protect = known, seal_payload
            if len(key.material) != KEY_BYTES:
                # Sealed or MACed under it, the event would be written and then refused by
                # every read (the size check there): refuse it before anything is written.
                raise KeyStoreError(
                    f"the key store returned key {key.key_id!r} of {len(key.material)} bytes "
                    f"for a write to {execution_id!r}; a data key is {KEY_BYTES} bytes "
                    "(AES-256): fix the key store's create; nothing was written"
                )
            value = event.payload
            payload = protect(
                key, value, execution_id=execution_id,
                sequence=first_sequence + offset, kind=event.kind, incarnation=incarnation,
                text=None if texts is None else texts[offset],
            )
            metadata: JsonObject = dict(event.metadata)
            metadata[INCARNATION_FIELD] = incarnation
            stored.append(build_new_event(event.kind, payload, metadata))
            values.append(value)
        return stored, values

    async def _prepare(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        first_sequence: int,
        guarded_by: int | None,
        texts: Sequence[str],
    ) -> tuple[list[NewEvent], list[JsonValue], str]:
        """The sealed events, the payloads they seal, and the incarnation they carry."""
        subjects = self._subjects(execution_id, events)
        incarnation = await self._incarnation_for_append(
            execution_id, first_sequence, guarded_by
        )
        stored, payloads = await self._seal(
            execution_id, events, subjects, first_sequence, incarnation, texts
        )
        return stored, payloads, incarnation

    def _landed(self, execution_id: str, incarnation: str, guarded_by: int | None) -> None:
        """After a successful append: remember its incarnation under the token the store
        accepted it under, when there was one."""
        if guarded_by is not None:
            self._incarnations.record(execution_id, incarnation, guarded_by)

    async def _append_clear(
        self, execution_id: str, events: Sequence[NewEvent], *, expected_sequence: int
    ) -> tuple[Event, ...]:
        """Append ``events`` authenticated in the clear, asking no ``subject_of``: the shred
        markers. On a log written by 0.1 they are written as 0.1 wrote them (bare), so the
        log stays one that ``legacy_reads`` reads."""
        incarnation = await self._log_incarnation_for_append(execution_id, expected_sequence)
        if incarnation is None:
            return await self.inner.append(
                execution_id, events, expected_sequence=expected_sequence
            )
        stored, payloads = await self._seal(
            execution_id, events, [None] * len(events), expected_sequence, incarnation
        )
        written = await self.inner.append(
            execution_id, stored, expected_sequence=expected_sequence
        )
        return _as_written(written, payloads)

    # -- reading -------------------------------------------------------------------------

    async def _anchor(self, execution_id: str, fallback: Event) -> Event:
        """The log's first stored event (sequence 0, or the first one a compaction kept)."""
        first = await self.inner.read(execution_id, limit=1)
        return first[0] if first else fallback

    def _log_incarnation(self, anchor: Event) -> str | None:
        """The incarnation every event of ``anchor``'s log must carry; ``None`` for a 0.1
        log read under ``legacy_reads``. Refuses a 0.1 log otherwise."""
        incarnation = _incarnation_of(anchor)
        if incarnation is None and not self._legacy_reads:
            raise _legacy_log(anchor.execution_id, anchor)
        return incarnation

    async def _open(self, event: Event, expected: str | None, keys: _Keys) -> Event:
        """``event`` as its writer handed it in, once its payload authenticates for it in
        the log incarnation ``expected``."""
        found = _incarnation_of(event)
        if expected is None and found is None:
            return await self._open_legacy(event, keys)
        if found != (LEGACY_INCARNATION if expected is None else expected):
            raise IncarnationMismatchError(event.execution_id, event.sequence, expected, found)
        assert found is not None
        payload, eid, seq, kind = event.payload, event.execution_id, event.sequence, event.kind
        if isinstance(payload, dict) and is_sealed(payload):
            sealed = parse_sealed(payload, execution_id=eid, sequence=seq)
            key = await self._subject_key(sealed, event, keys)
            opened = open_payload(
                key, sealed, execution_id=eid, sequence=seq, kind=kind, incarnation=found
            )
        elif isinstance(payload, dict) and is_clear(payload):
            clear = parse_clear(payload, execution_id=eid, sequence=seq)
            key = await self._integrity_key_named(clear.key_id, event)
            opened = open_clear(
                key, clear, execution_id=eid, sequence=seq, kind=kind, incarnation=found
            )
        else:
            raise UnauthenticatedPayloadError(
                event.execution_id, event.sequence, None,
                "it is stored in plaintext with no MAC, which this decorator never writes "
                "(the row was replaced)",
            )
        return _opened(event, opened)

    async def _open_legacy(self, event: Event, keys: _Keys) -> Event:
        """A format-1 event of a 0.1 log (``legacy_reads`` only): a format-1 seal opens
        under format 1's associated data; a bare payload is returned as 0.1 returned it."""
        payload = event.payload
        if isinstance(payload, dict) and is_sealed(payload):
            sealed = parse_sealed(payload, execution_id=event.execution_id,
                                  sequence=event.sequence, legacy=True)
            if sealed.version != 1:
                raise _unstamped(event)
            key = await self._subject_key(sealed, event, keys)
            opened = open_payload(key, sealed, execution_id=event.execution_id,
                                  sequence=event.sequence, kind=event.kind,
                                  incarnation=LEGACY_INCARNATION)
            return dataclasses.replace(event, payload=opened)
        if isinstance(payload, dict) and is_clear(payload):
            raise _unstamped(event)
        return event

    async def _open_all(
        self, execution_id: str, events: Sequence[Event], *, starts_log: bool
    ) -> tuple[Event, ...]:
        """``events`` opened; ``starts_log``: the first of them is the log's first stored
        event (the read started at 0), so no extra read is needed for the anchor."""
        if not events:
            return ()
        anchor = events[0] if starts_log else await self._anchor(execution_id, events[0])
        expected = self._log_incarnation(anchor)
        # One key lookup per key id per call; never cached across calls, so a key destroyed
        # by another process is noticed on the next read.
        keys: _Keys = {}
        return tuple([await self._open(event, expected, keys) for event in events])

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
        the log's incarnation, and append. A subject whose key was destroyed is refused
        (:class:`~loom_crypto.KeyDestroyedError`) before anything is written."""
        execution_id, checked, texts, expected_sequence = _check_append(
            execution_id, events, expected_sequence
        )
        if fence is not None:
            fence = check_fence(fence)
        elif expected_sequence > 0:
            known = self._incarnations.known(execution_id)
            if known is not None and "append_if_unchanged" in self.inner.capabilities:
                unchanged = await self._append_unchanged(
                    execution_id, checked, texts, expected_sequence, known
                )
                if unchanged is not None:
                    return unchanged
        stored, payloads, incarnation = await self._prepare(
            execution_id, checked, expected_sequence, fence, texts
        )
        written = await self.inner.append(
            execution_id, stored, expected_sequence=expected_sequence, fence=fence
        )
        # A log created unfenced is remembered under token 0, the guess incarnations.py
        # explains; any other unfenced append leaves nothing to remember.
        self._landed(
            execution_id, incarnation, 0 if fence is None and expected_sequence == 0 else fence
        )
        return _as_written(written, payloads)

    async def _append_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        texts: Sequence[str],
        expected_sequence: int,
        known: tuple[str, int],
    ) -> tuple[Event, ...] | None:
        """An unfenced append made ``append_if_unchanged`` under the remembered token, in
        the remembered incarnation; None when the store refused that token (nothing was
        written, and the entry is forgotten)."""
        token = known[1]
        # Under the remembered token, _prepare takes the remembered incarnation.
        stored, payloads, incarnation = await self._prepare(
            execution_id, events, expected_sequence, token, texts
        )
        try:
            written = await self.inner.append_if_unchanged(
                execution_id, stored, expected_sequence=expected_sequence,
                observed_fence=token,
            )
        except StaleFenceError:
            self._incarnations.forget_if_still(execution_id, known)
            return None
        self._landed(execution_id, incarnation, token)  # still true, and now the newest
        return _as_written(written, payloads)

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
        return await self._open_all(execution_id, events, starts_log=from_sequence == 0)

    async def read_sealed(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        """The events as stored: payloads stay sealed (or in their clear envelope) and the
        metadata keeps its incarnation stamp. Needs no key, so it reads the kinds,
        sequences, fences and metadata of a shredded log."""
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
        execution_id, checked, texts, expected_sequence = _check_append(
            execution_id, events, expected_sequence
        )
        observed_fence = check_fence(observed_fence, "observed_fence")
        stored, payloads, incarnation = await self._prepare(
            execution_id, checked, expected_sequence, observed_fence, texts
        )
        written = await self.inner.append_if_unchanged(
            execution_id, stored, expected_sequence=expected_sequence,
            observed_fence=observed_fence,
        )
        self._landed(execution_id, incarnation, observed_fence)
        return _as_written(written, payloads)

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        checked = check_append_requests(requests)
        subjects = [self._subjects(r.execution_id, events) for r, events in checked]
        sealed_requests: list[AppendRequest] = []
        all_payloads: list[list[JsonValue]] = []
        incarnations: list[str] = []
        for (request, events), batch_subjects in zip(checked, subjects, strict=True):
            incarnation = await self._incarnation_for_append(
                request.execution_id, request.expected_sequence, request.fence
            )
            incarnations.append(incarnation)
            stored, payloads = await self._seal(
                request.execution_id, events, batch_subjects, request.expected_sequence,
                incarnation,
            )
            sealed_requests.append(dataclasses.replace(request, events=tuple(stored)))
            all_payloads.append(payloads)
        written = await self.inner.append_many(sealed_requests)
        for request, incarnation in zip(sealed_requests, incarnations, strict=True):
            self._landed(request.execution_id, incarnation, request.fence)
        return tuple(
            _as_written(batch, payloads)
            for batch, payloads in zip(written, all_payloads, strict=True)
        )

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        """The inner subscription, each event opened as it arrives; a shredded payload
        ends it with :class:`~loom_core.PayloadShreddedError`, and an event of another
        incarnation (the log was deleted and re-created meanwhile) with
        :class:`~loom_crypto.IncarnationMismatchError`."""
        return self._opening(
            execution_id, self.inner.subscribe(execution_id, from_sequence=from_sequence)
        )

    async def _opening(
        self, execution_id: str, source: AsyncIterator[Event]
    ) -> AsyncIterator[Event]:
        try:
            expected: str | None = None
            anchored = False
            async for event in source:
                if not anchored:
                    expected = self._log_incarnation(await self._anchor(execution_id, event))
                    anchored = True
                yield await self._open(event, expected, {})
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=Implement(append_if_unchanged),
        append_many=Implement(append_many),
        delete_execution=FORWARD,
        copy_prefix=Refuse(
            "sealed payloads are bound to their execution id, so a copied ciphertext would "
            "not open under the target; branch by reading the prefix through the crypto "
            "decorator and appending it to the target, which seals it for the target"
        ),
        truncate_prefix_keeping=FORWARD,
        subscribe=Implement(subscribe),
    )


def _check_append(
    execution_id: object, events: object, expected_sequence: object
) -> tuple[str, tuple[NewEvent, ...], tuple[str, ...], int]:
    """``check_append``, with each payload's JSON text as the check wrote it (what is
    sealed, so the payload is not encoded a second time)."""
    execution_id = check_execution_id(execution_id)
    checked, texts = check_events_with_text(events)
    return execution_id, checked, texts, check_sequence(expected_sequence, "expected_sequence")


def _incarnation_of(event: Event) -> str | None:
    """The incarnation stamped on ``event``; ``None`` when it carries none (format 1)."""
    value = event.metadata.get(INCARNATION_FIELD)
    if value is None or isinstance(value, str):
        return value
    raise PayloadAuthenticationError(
        event.execution_id, event.sequence, None, "its incarnation stamp is not a string"
    )


def _unstamped(event: Event) -> PayloadAuthenticationError:
    return PayloadAuthenticationError(
        event.execution_id, event.sequence, None,
        "a format-2 payload whose event carries no incarnation stamp (its metadata was "
        "altered)",
    )


def _legacy_log(execution_id: str, anchor: Event) -> UnauthenticatedPayloadError:
    return UnauthenticatedPayloadError(
        execution_id, anchor.sequence, None,
        "the log's first stored event carries no incarnation: the log was written by "
        "loom-crypto 0.1 (format 1, which did not authenticate clear payloads nor bind the "
        "incarnation), or that event's metadata was altered. Open the decorator with "
        "legacy_reads=True to read 0.1 logs with 0.1's guarantees",
    )


def _visible(metadata: JsonObject) -> JsonObject:
    visible = dict(metadata)
    visible.pop(INCARNATION_FIELD, None)
    return visible


def _as_written(written: Sequence[Event], payloads: Sequence[JsonValue]) -> tuple[Event, ...]:
    """The stored events with the payloads and metadata the caller wrote (as a read would
    return them)."""
    return tuple([
        _opened(event, payload) for event, payload in zip(written, payloads, strict=True)
    ])


def _opened(event: Event, payload: JsonValue) -> Event:
    """``event`` with ``payload`` and without the incarnation stamp (its other fields are
    the inner store's fresh copies, so they are shared, not copied again)."""
    return build_event(
        event.execution_id, event.sequence, event.kind, payload, _visible(event.metadata),
        event.recorded_at,
    )
