"""The shred test: one subject erased, with proof; everyone else and all metadata intact."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import subject_prefix
from loom_crypto import (
    CryptoEventStore,
    DataKey,
    FileKeyStore,
    KeyDestroyedError,
    KeyStore,
    KeyStoreUnavailableError,
    MemoryKeyStore,
    ShredIncompleteError,
    shred_subject,
)

from loom_core import (
    Event,
    EventKind,
    FenceAcquired,
    InvalidOptionError,
    NewEvent,
    PayloadShreddedError,
    StorageUnavailableError,
    StorageWriteError,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator
from loom_core.memory import MemoryEventStore

ALICE_LOGS = ("alice/order-1", "alice/order-2", "shared/chat")


async def _populate(store: CryptoEventStore) -> None:
    token = await store.acquire_fence("alice/order-1")
    await store.append(
        "alice/order-1",
        [NewEvent(EventKind.EXECUTION_STARTED, {"card": "4111"}),
         NewEvent(EventKind.EXECUTION_SUSPENDED, {"waiting": "bank"})],
        expected_sequence=0,
        fence=token,
    )
    await store.append("alice/order-2", [NewEvent("X", {"address": "1 Rue"})], expected_sequence=0)
    await store.append("bob/order-1", [NewEvent("X", {"bob": 1})], expected_sequence=0)
    await store.append(
        "shared/chat",
        [NewEvent("MSG", {"text": f"hello {i}"}, {"subject": ("alice", "bob")[i % 2]})
         for i in range(4)],
        expected_sequence=0,
    )
    await store.append("public/news", [NewEvent("X", {"open": 1})], expected_sequence=0)


async def _dump(store: MemoryEventStore) -> bytes:
    """Every byte the event store holds, as JSON."""
    rows = []
    for execution_id in await store.list_executions(limit=1000):
        for e in await store.read(execution_id):
            rows.append([e.execution_id, e.sequence, e.kind, e.payload, e.metadata])
    return json.dumps(rows).encode()


def _files_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _forms(material: bytes) -> list[bytes]:
    return [material, base64.b64encode(material), material.hex().encode()]


async def test_shredding_a_subject_erases_its_payloads_and_only_those(
    sealed: CryptoEventStore, inner: MemoryEventStore, key_store: KeyStore, tmp_path: Path
) -> None:
    await _populate(sealed)
    kid = await key_store.key_id_for("alice")
    assert kid is not None
    material = (await key_store.get(kid)).material

    result = await shred_subject(sealed, "alice")

    assert result.key_id == kid
    assert result.executions == ALICE_LOGS
    assert result.destroyed_now
    assert await key_store.was_destroyed(kid)
    for execution_id in ALICE_LOGS:
        # The markers are clear payloads: they open (authenticated) after the shred.
        head = await sealed.head(execution_id)
        tail = await sealed.read(execution_id, from_sequence=head - 2)
        assert [(e.kind, e.payload) for e in tail] == [
            (EventKind.ERASURE_PENDING, {"kid": kid}),
            (EventKind.PAYLOAD_SHREDDED, {"kid": kid}),
        ]
    # Alice's payloads: gone, recognisably.
    with pytest.raises(PayloadShreddedError) as caught:
        await sealed.read("alice/order-1")
    assert (caught.value.execution_id, caught.value.sequence, caught.value.key_id) == (
        "alice/order-1", 0, kid,
    )
    assert isinstance(caught.value.__cause__, KeyDestroyedError)
    with pytest.raises(PayloadShreddedError):
        await sealed.read("shared/chat", from_sequence=2, to_sequence=2)
    # Everyone else: untouched.
    assert [e.payload for e in await sealed.read("bob/order-1")] == [{"bob": 1}]
    assert [e.payload for e in await sealed.read("public/news")] == [{"open": 1}]
    assert (await sealed.read("shared/chat", from_sequence=1, to_sequence=1))[0].payload == {
        "text": "hello 1"
    }
    # Metadata, kinds, sequences and fences: still working.
    shredded = await sealed.read_sealed("alice/order-1")
    assert [(e.sequence, e.kind) for e in shredded][:2] == [
        (0, EventKind.EXECUTION_STARTED), (1, EventKind.EXECUTION_SUSPENDED)
    ]
    assert shredded[1].fence == 1
    acquired = await sealed.acquire_fence_if("alice/order-1", fence=1, park_seq=1)
    assert isinstance(acquired, FenceAcquired)
    # New sealed writes for the subject fail loudly.
    with pytest.raises(KeyDestroyedError):
        await sealed.append("alice/order-3", [NewEvent("X", 1)], expected_sequence=0)
    assert await sealed.head("alice/order-3") == 0
    # The key's bytes are nowhere: not in the log, not in the key store's files.
    held = await _dump(inner) + _files_under(tmp_path)
    assert not any(form in held for form in _forms(material))


async def test_shredding_twice_changes_nothing_more(sealed: CryptoEventStore) -> None:
    await _populate(sealed)
    first = await shred_subject(sealed, "alice")
    heads = [await sealed.head(e) for e in ALICE_LOGS]
    again = await shred_subject(sealed, "alice")
    assert (again.key_id, again.executions, again.destroyed_now) == (
        first.key_id, first.executions, False,
    )
    assert [await sealed.head(e) for e in ALICE_LOGS] == heads


async def test_a_subject_that_never_wrote_has_nothing_to_shred(sealed: CryptoEventStore) -> None:
    await _populate(sealed)
    result = await shred_subject(sealed, "zoe")
    assert (result.key_id, result.executions) == (None, ())


async def test_subscribe_ends_with_payload_shredded(sealed: CryptoEventStore) -> None:
    await _populate(sealed)
    await shred_subject(sealed, "alice")
    stream = sealed.subscribe("alice/order-2")
    with pytest.raises(PayloadShreddedError):
        await anext(stream)


# -- a crash between steps ------------------------------------------------------------------


class _CrashingKeyStore:
    """A key store whose process dies in ``destroy`` (before anything is destroyed), or
    whose ``destroy`` reports success without recording it (``forgetful``)."""

    def __init__(self, real: KeyStore, *, forgetful: bool = False) -> None:
        self.real = real
        self.forgetful = forgetful

    async def create(self, subject: str) -> DataKey:
        return await self.real.create(subject)

    async def get(self, key_id: str) -> DataKey:
        return await self.real.get(key_id)

    async def key_id_for(self, subject: str) -> str | None:
        return await self.real.key_id_for(subject)

    async def destroy(self, key_id: str) -> bool:
        if self.forgetful:
            return True
        raise RuntimeError("simulated crash before the key was destroyed")

    async def was_destroyed(self, key_id: str) -> bool:
        return await self.real.was_destroyed(key_id)


class _DiesOnTombstone(EventStoreDecorator):
    """The process dies when it writes the first PAYLOAD_SHREDDED (after the destroy)."""

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        if any(e.kind == EventKind.PAYLOAD_SHREDDED for e in events):
            raise StorageWriteError("simulated crash before the tombstone was written")
        return await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )

    decisions = Decisions(
        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
        append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
    )


def _kinds(events: Sequence[Event]) -> list[str]:
    return [e.kind for e in events]


async def test_a_crash_before_the_destroy_is_completed_by_a_retry(
    inner: MemoryEventStore, key_store: KeyStore
) -> None:
    healthy = CryptoEventStore(inner, key_store=key_store, subject_of=subject_prefix)
    await _populate(healthy)
    crashing = CryptoEventStore(
        inner, key_store=_CrashingKeyStore(key_store),
        subject_of=subject_prefix,
    )
    with pytest.raises(KeyStoreUnavailableError, match="call shred_subject again") as caught:
        await shred_subject(crashing, "alice")
    # The key store's own error, a storage outage to the caller, with the cause kept.
    assert isinstance(caught.value, StorageUnavailableError)
    assert isinstance(caught.value.__cause__, RuntimeError)
    # Intent recorded, nothing destroyed, no tombstone: the payloads still read.
    assert _kinds(await inner.read("alice/order-2"))[-1] == EventKind.ERASURE_PENDING
    assert (await healthy.read("alice/order-2"))[0].payload == {"address": "1 Rue"}

    result = await shred_subject(healthy, "alice")
    assert result.destroyed_now
    for execution_id in ALICE_LOGS:
        kinds = _kinds(await inner.read(execution_id))
        assert kinds.count(EventKind.ERASURE_PENDING) == 1
        assert kinds[-1] == EventKind.PAYLOAD_SHREDDED
    with pytest.raises(PayloadShreddedError):
        await healthy.read("alice/order-2")


async def test_a_crash_after_the_destroy_is_completed_on_the_key_stores_proof(
    tmp_path: Path,
) -> None:
    inner = MemoryEventStore()
    keys = FileKeyStore(tmp_path / "keys")
    await _populate(CryptoEventStore(inner, key_store=keys, subject_of=subject_prefix))
    dying = CryptoEventStore(_DiesOnTombstone(inner), key_store=keys, subject_of=subject_prefix)
    with pytest.raises(StorageWriteError):
        await shred_subject(dying, "alice")
    assert not any(
        [EventKind.PAYLOAD_SHREDDED in _kinds(await inner.read(e)) for e in ALICE_LOGS]
    )

    # A new process: a fresh key store over the same directory proves the destruction.
    restarted = CryptoEventStore(
        inner, key_store=FileKeyStore(tmp_path / "keys"), subject_of=subject_prefix
    )
    result = await shred_subject(restarted, "alice")
    assert not result.destroyed_now
    assert result.executions == ALICE_LOGS
    for execution_id in ALICE_LOGS:
        assert _kinds(await inner.read(execution_id))[-2:] == [
            EventKind.ERASURE_PENDING, EventKind.PAYLOAD_SHREDDED,
        ]


async def test_no_tombstone_without_proof_of_destruction(
    inner: MemoryEventStore, key_store: KeyStore
) -> None:
    await _populate(CryptoEventStore(inner, key_store=key_store, subject_of=subject_prefix))
    unproven = CryptoEventStore(
        inner, key_store=_CrashingKeyStore(key_store, forgetful=True),
        subject_of=subject_prefix,
    )
    with pytest.raises(ShredIncompleteError) as caught:
        await shred_subject(unproven, "alice")
    assert caught.value.key_id == await key_store.key_id_for("alice")
    for execution_id in ALICE_LOGS:
        assert EventKind.PAYLOAD_SHREDDED not in _kinds(await inner.read(execution_id))


# -- through open_storage ---------------------------------------------------------------------


async def test_shred_through_open_storage_finds_the_crypto_layer() -> None:
    keys = MemoryKeyStore()
    async with open_storage(
        "memory://", decorators=[("crypto", {"key_store": keys, "subject_of": subject_prefix})]
    ) as storage:
        await storage.events.append("alice/a", [NewEvent("X", 1)], expected_sequence=0)
        result = await shred_subject(storage, "alice")
        assert result.executions == ("alice/a",)
        with pytest.raises(PayloadShreddedError):
            await storage.events.read("alice/a")


async def test_shred_without_a_crypto_layer_is_refused() -> None:
    async with open_storage("memory://") as storage:
        with pytest.raises(InvalidOptionError, match="no crypto decorator"):
            await shred_subject(storage, "alice")
