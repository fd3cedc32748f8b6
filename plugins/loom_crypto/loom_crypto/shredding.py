"""``shred_subject``: erase one subject's payloads by destroying its key, with proof.

The protocol; the log is never rewritten:

1. **intent**: ERASURE_PENDING ``{"kid": …}`` on each log holding a payload sealed under the
   subject's key (skipped once the key store already proves the key destroyed);
2. **destroy** the key in the key store;
3. **proof**: ``was_destroyed(kid)`` must now be true. If it is not, nothing more is written
   and :class:`~loom_crypto.ShredIncompleteError` is raised;
4. **tombstone**: PAYLOAD_SHREDDED ``{"kid": …}`` on each of those logs.

Each step is idempotent and the logs are re-scanned after the destroy, so a crash anywhere
is completed by calling ``shred_subject`` again: a retry that finds the key already
destroyed writes the missing tombstones, because the key store proves the destruction; a
retry that finds it live runs the whole protocol. A tombstone is never written on anything
but that proof.

The markers are appended unfenced (like every audit append: it must never be refused because
someone else holds the execution, see docs/design.md, "The log and the fence") at the log's head,
re-reading the head on a conflict, without asking ``subject_of``: they carry only the opaque
key id, in the clear, authenticated under the integrity key and the log's incarnation like
every clear payload (on a log written by loom-crypto 0.1, bare, as 0.1 wrote them).
Stacked over the audit chain (the documented order) they are chained like any other event.

Finding the subject's logs reads every log (or only ``executions``, when the application
keeps its own index): the cost is one full scan of the store, twice.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Final

from loom_core import Event, EventKind, NewEvent, Storage
from loom_core.decorating import find_layer
from loom_core.errors import InvalidOptionError, SequenceConflictError
from loom_core.spi import EventStore, check_execution_id, check_key
from loom_crypto.errors import ShredIncompleteError
from loom_crypto.keys import ask_key_store
from loom_crypto.sealing import INTEGRITY_SUBJECT, is_clear, is_sealed
from loom_crypto.store import CryptoEventStore

__all__ = ["ShredResult", "find_crypto_store", "shred_subject"]

_AGAIN: Final = (
    "call shred_subject again once the key store answers: it completes what this call began"
)

_PAGE: Final = 500
_APPEND_ATTEMPTS: Final = 32


@dataclass(frozen=True, slots=True)
class ShredResult:
    """What ``shred_subject`` did.

    ``key_id`` is ``None`` when the subject never had a key (nothing to shred);
    ``executions`` are the logs that now end their sealed history with a PAYLOAD_SHREDDED
    tombstone for the key; ``destroyed_now`` is false when an earlier call had already
    destroyed it (this call completed or confirmed that one).
    """

    key_id: str | None
    executions: tuple[str, ...]
    destroyed_now: bool


@dataclass(slots=True)
class _LogState:
    sealed: bool = False
    pending: bool = False
    shredded: bool = False

    def observe(self, event: Event, key_id: str) -> None:
        payload = event.payload
        if isinstance(payload, dict) and is_clear(payload):
            # A marker is a clear payload; this scan only finds logs, a read of them
            # authenticates it.
            text = payload.get("json")
            try:
                payload = json.loads(text) if isinstance(text, str) else None
            except ValueError:
                return
        if not isinstance(payload, dict) or payload.get("kid") != key_id:
            return
        if is_sealed(payload):
            self.sealed = True
        elif event.kind == EventKind.ERASURE_PENDING:
            self.pending = True
        elif event.kind == EventKind.PAYLOAD_SHREDDED:
            self.shredded = True

    @property
    def involved(self) -> bool:
        return self.sealed or self.pending or self.shredded


def find_crypto_store(target: Storage | EventStore) -> CryptoEventStore:
    """The crypto decorator in ``target``'s stack (a Storage or an event store), however
    many decorators wrap it."""
    store = find_layer(target, CryptoEventStore)
    if store is not None:
        return store
    raise InvalidOptionError(
        "no crypto decorator in this store's stack; open it with decorators=[..., 'crypto']"
    )


async def shred_subject(
    target: Storage | EventStore,
    subject: str,
    *,
    executions: Iterable[str] | None = None,
) -> ShredResult:
    """Destroy ``subject``'s key and mark every log it sealed (see the module docstring).

    Afterwards reading any of the subject's payloads raises
    :class:`~loom_core.PayloadShreddedError`, other subjects read as before, and kinds,
    sequences, fences and metadata stay readable. Refuses (:class:`ShredIncompleteError`,
    no tombstone written) when the key store cannot prove the destruction.
    """
    crypto = find_crypto_store(target)
    subject = check_key(subject, "subject")
    if subject == INTEGRITY_SUBJECT:
        raise InvalidOptionError(
            f"{INTEGRITY_SUBJECT!r} is the reserved subject whose key authenticates every "
            "clear payload; it holds no personal data and is never shredded"
        )
    scope: tuple[str, ...] | None = None
    if executions is not None:
        if isinstance(executions, str):
            raise InvalidOptionError("executions must be a collection of ids, not one str")
        scope = tuple(check_execution_id(e) for e in executions)
    keys, raw = crypto.key_store, crypto.inner
    key_id = await ask_key_store(keys.key_id_for(subject), "look up the subject's key", _AGAIN)
    if key_id is None:
        return ShredResult(None, (), False)

    destroyed_now = False
    if not await ask_key_store(keys.was_destroyed(key_id), f"check key {key_id!r}", _AGAIN):
        for execution_id, state in (await _scan(raw, key_id, scope)).items():
            if state.sealed and not (state.pending or state.shredded):
                await _mark(crypto, execution_id, EventKind.ERASURE_PENDING, key_id)
        destroyed_now = await ask_key_store(keys.destroy(key_id), f"destroy key {key_id!r}", _AGAIN)
        if not await ask_key_store(
            keys.was_destroyed(key_id), f"check key {key_id!r}", _AGAIN
        ):
            raise ShredIncompleteError(key_id)

    logs = await _scan(raw, key_id, scope)
    for execution_id, state in logs.items():
        if not state.shredded:
            await _mark(crypto, execution_id, EventKind.PAYLOAD_SHREDDED, key_id)
    return ShredResult(key_id, tuple(sorted(logs)), destroyed_now)


async def _scan(
    store: EventStore, key_id: str, scope: tuple[str, ...] | None
) -> dict[str, _LogState]:
    found: dict[str, _LogState] = {}
    async for execution_id in _executions(store, scope):
        state = _LogState()
        next_sequence = 0
        while True:
            page = await store.read(execution_id, from_sequence=next_sequence, limit=_PAGE)
            for event in page:
                state.observe(event, key_id)
            if len(page) < _PAGE:
                break
            next_sequence = page[-1].sequence + 1
        if state.involved:
            found[execution_id] = state
    return found


async def _executions(store: EventStore, scope: tuple[str, ...] | None) -> AsyncIterator[str]:
    if scope is not None:
        for execution_id in scope:
            yield execution_id
        return
    after: str | None = None
    while True:
        page = await store.list_executions(after=after, limit=_PAGE)
        for execution_id in page:
            yield execution_id
        if len(page) < _PAGE:
            return
        after = page[-1]


async def _mark(
    crypto: CryptoEventStore, execution_id: str, kind: EventKind, key_id: str
) -> None:
    """Append one marker at the head, unfenced, authenticated in the clear; a concurrent
    append only moves the head."""
    marker = NewEvent(kind.value, {"kid": key_id})
    for _ in range(_APPEND_ATTEMPTS):
        head = await crypto.inner.head(execution_id)
        if head == 0:
            return  # the log was deleted meanwhile: nothing left to mark
        try:
            await crypto._append_clear(execution_id, [marker], expected_sequence=head)
            return
        except SequenceConflictError:
            continue
    raise SequenceConflictError(execution_id, head, await crypto.inner.head(execution_id))
