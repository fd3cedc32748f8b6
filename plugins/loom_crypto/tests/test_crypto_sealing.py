"""Sealing through the decorator: what the inner store holds, what callers read back."""

from __future__ import annotations

import json

import pytest
from conftest import subject_prefix
from loom_crypto import (
    CLEAR_MARKER,
    INCARNATION_FIELD,
    INTEGRITY_SUBJECT,
    SEALED_MARKER,
    CryptoEventStore,
    DataKey,
    KeyStore,
    KeyStoreUnavailableError,
    MemoryKeyStore,
    PayloadAuthenticationError,
)

from loom_core import (
    AppendRequest,
    EventKind,
    FenceAcquired,
    InvalidEventError,
    InvalidOptionError,
    JsonValue,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    StorageUnavailableError,
    Unsupported,
)
from loom_core.memory import MemoryEventStore
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS

PAYLOADS: list[JsonValue] = [
    {"card": "4111 1111 1111 1111", "amount": 12.5, "items": [1, 2, {"sku": "é"}]},
    "a plain string",
    42,
    None,
    [True, False, None],
]


async def test_payloads_round_trip_and_are_stored_sealed(
    sealed: CryptoEventStore, inner: MemoryEventStore
) -> None:
    events = [NewEvent("STEP_COMPLETED", p, {"step": i}) for i, p in enumerate(PAYLOADS)]
    written = await sealed.append("alice/order-1", events, expected_sequence=0)

    read = await sealed.read("alice/order-1")
    assert [e.payload for e in read] == PAYLOADS
    assert [e.payload for e in written] == PAYLOADS
    stored = await inner.read("alice/order-1")
    for event in stored:
        assert isinstance(event.payload, dict)
        assert set(event.payload) == {SEALED_MARKER, "kid", "n", "ct"}
    assert "4111" not in json.dumps([e.payload for e in stored])
    # Kinds, sequences and metadata stay plaintext; every event carries the log's
    # incarnation, which a read does not show.
    incarnation = stored[0].metadata[INCARNATION_FIELD]
    assert [(e.sequence, e.kind, e.metadata) for e in stored] == [
        (i, "STEP_COMPLETED", {"step": i, INCARNATION_FIELD: incarnation})
        for i in range(len(PAYLOADS))
    ]
    assert [e.metadata for e in read] == [{"step": i} for i in range(len(PAYLOADS))]


async def test_read_sealed_needs_no_key_and_shows_the_envelopes(
    sealed: CryptoEventStore,
) -> None:
    await sealed.append("alice/a", [NewEvent("X", {"secret": 1})], expected_sequence=0)
    (raw,) = await sealed.read_sealed("alice/a")
    assert isinstance(raw.payload, dict)
    assert raw.payload[SEALED_MARKER] == 2
    assert isinstance(raw.metadata[INCARNATION_FIELD], str)


async def test_each_seal_uses_a_fresh_nonce(
    sealed: CryptoEventStore, inner: MemoryEventStore
) -> None:
    same = [NewEvent("X", {"same": "payload"}) for _ in range(50)]
    await sealed.append("alice/n", same, expected_sequence=0)
    nonces = set()
    for event in await inner.read("alice/n"):
        assert isinstance(event.payload, dict)
        nonces.add(event.payload["n"])
    assert len(nonces) == 50


async def test_subjects_get_their_own_keys_and_none_means_clear_but_authenticated(
    sealed: CryptoEventStore, inner: MemoryEventStore, key_store: KeyStore
) -> None:
    await sealed.append("alice/a", [NewEvent("X", 1)], expected_sequence=0)
    await sealed.append("bob/b", [NewEvent("X", 2)], expected_sequence=0)
    await sealed.append("public/p", [NewEvent("X", {"open": True})], expected_sequence=0)
    (a,), (b,), (p,) = [await inner.read(i) for i in ("alice/a", "bob/b", "public/p")]
    assert isinstance(a.payload, dict)
    assert isinstance(b.payload, dict)
    assert a.payload["kid"] != b.payload["kid"]
    assert isinstance(p.payload, dict)
    assert set(p.payload) == {CLEAR_MARKER, "kid", "mac", "json"}
    assert p.payload["json"] == '{"open":true}'  # readable in the database
    assert p.payload["kid"] == await key_store.key_id_for(INTEGRITY_SUBJECT)
    assert (await sealed.read("public/p"))[0].payload == {"open": True}


async def test_a_payload_is_sealed_as_the_text_its_writer_gave_and_read_back_in_its_order(
    sealed: CryptoEventStore, inner: MemoryEventStore
) -> None:
    # The text the kernel's check wrote is what is sealed or authenticated: compact, the
    # writer's key order kept (no second, sorted encoding), and a read gives that order
    # back. A batch through append_many, and older logs, are sorted: either order opens.
    payload: JsonValue = {"zeta": 1, "alpha": {"b": 2, "a": [1, "é"]}}
    await sealed.append("public/order", [NewEvent("X", payload)], expected_sequence=0)
    await sealed.append("alice/order", [NewEvent("X", payload)], expected_sequence=0)
    token = await sealed.acquire_fence("alice/order")
    await sealed.append("alice/order", [NewEvent("Y", payload)], expected_sequence=1, fence=token)
    await sealed.append_many([AppendRequest("bob/order", [NewEvent("X", payload)], 0)])

    (clear,) = await inner.read("public/order")
    assert isinstance(clear.payload, dict)
    assert clear.payload["json"] == '{"zeta":1,"alpha":{"b":2,"a":[1,"é"]}}'
    for execution_id, count in (("public/order", 1), ("alice/order", 2), ("bob/order", 1)):
        read = await sealed.read(execution_id)
        assert len(read) == count
        for event in read:
            assert event.payload == payload
            assert isinstance(event.payload, dict)
            if execution_id != "bob/order":
                assert list(event.payload) == ["zeta", "alpha"]
                assert isinstance(event.payload["alpha"], dict)
                assert list(event.payload["alpha"]) == ["b", "a"]


async def test_fences_and_conditional_fences_work_on_sealed_logs(sealed: CryptoEventStore) -> None:
    token = await sealed.acquire_fence("alice/f")
    await sealed.append(
        "alice/f",
        [NewEvent(EventKind.EXECUTION_STARTED, {"x": 1}),
         NewEvent(EventKind.EXECUTION_SUSPENDED, {"wait": "y"})],
        expected_sequence=0,
        fence=token,
    )
    parked = (await sealed.read("alice/f"))[1]
    assert parked.fence == token
    newer = await sealed.acquire_fence_if("alice/f", fence=parked.fence, park_seq=1)
    assert isinstance(newer, FenceAcquired)
    with pytest.raises(StaleFenceError):
        await sealed.append("alice/f", [NewEvent("Y")], expected_sequence=2, fence=token)
    await sealed.append(
        "alice/f", [NewEvent(EventKind.EXECUTION_RESUMED, {"ok": 1})], expected_sequence=2,
        fence=newer.fence,
    )
    assert await sealed.head("alice/f") == 3


async def test_a_conflicting_append_writes_nothing(sealed: CryptoEventStore) -> None:
    await sealed.append("alice/c", [NewEvent("X", 1)], expected_sequence=0)
    with pytest.raises(SequenceConflictError) as caught:
        await sealed.append("alice/c", [NewEvent("X", 2)], expected_sequence=0 + 5)
    assert caught.value.actual_head == 1
    assert [e.payload for e in await sealed.read("alice/c")] == [1]


async def test_the_reserved_marker_key_is_refused_and_nothing_is_written(
    sealed: CryptoEventStore, key_store: KeyStore
) -> None:
    with pytest.raises(InvalidEventError, match=r"\$loom_sealed"):
        await sealed.append(
            "bob/r",
            [NewEvent("X", 1), NewEvent("X", {SEALED_MARKER: 1, "kid": "k"})],
            expected_sequence=0,
        )
    assert await sealed.head("bob/r") == 0
    assert await key_store.key_id_for("bob") is None


async def test_a_bad_subject_is_refused_before_any_key_is_created(inner: MemoryEventStore) -> None:
    keys = MemoryKeyStore()
    store = CryptoEventStore(
        inner, key_store=keys, subject_of=lambda eid, ev: "" if ev.kind == "BAD" else eid
    )
    with pytest.raises(InvalidOptionError, match="subject_of returned"):
        await store.append("e", [NewEvent("OK", 1), NewEvent("BAD", 2)], expected_sequence=0)
    assert await keys.key_id_for("e") is None
    assert await inner.head("e") == 0


async def test_a_subject_of_that_raises_is_refused_as_a_loom_error(
    inner: MemoryEventStore,
) -> None:
    def subject_of(execution_id: str, event: NewEvent) -> str:
        if event.kind == "BAD":
            raise ValueError("no subject for this event")
        return execution_id

    keys = MemoryKeyStore()
    store = CryptoEventStore(inner, key_store=keys, subject_of=subject_of)
    with pytest.raises(InvalidOptionError, match="subject_of raised ValueError") as caught:
        await store.append("e", [NewEvent("OK", 1), NewEvent("BAD", 2)], expected_sequence=0)
    assert isinstance(caught.value.__cause__, ValueError)
    assert await keys.key_id_for("e") is None
    assert await inner.head("e") == 0


class _UnreachableKeyStore(MemoryKeyStore):
    """A key store whose service can be cut off, as a KMS client raises when it is."""

    reachable = True

    def _reach(self) -> None:
        if not self.reachable:
            raise ConnectionError("kms.internal: connection refused")

    async def create(self, subject: str) -> DataKey:
        self._reach()
        return await super().create(subject)

    async def get(self, key_id: str) -> DataKey:
        self._reach()
        return await super().get(key_id)

    async def key_id_for(self, subject: str) -> str | None:
        self._reach()
        return await super().key_id_for(subject)


async def test_a_key_store_that_cannot_be_reached_is_a_storage_unavailable_error(
    inner: MemoryEventStore,
) -> None:
    keys = _UnreachableKeyStore()
    store = CryptoEventStore(inner, key_store=keys, subject_of=subject_prefix)
    await store.append("alice/o", [NewEvent("STEP_COMPLETED", 1)], expected_sequence=0)
    fresh = CryptoEventStore(inner, key_store=keys, subject_of=subject_prefix)  # no key kept
    before = await inner.read("alice/o")
    keys.reachable = False

    calls = [
        ("read", fresh.read("alice/o")),
        ("append", fresh.append("alice/o", [NewEvent("K", 2)], expected_sequence=1)),
        ("append of a new subject", store.append("bob/o", [NewEvent("K", 3)], expected_sequence=0)),
        ("clear append", fresh.append("public/o", [NewEvent("K", 4)], expected_sequence=0)),
    ]
    for what, call in calls:
        with pytest.raises(KeyStoreUnavailableError, match="connection refused") as caught:
            await call
        assert isinstance(caught.value, StorageUnavailableError), what
        assert isinstance(caught.value.__cause__, ConnectionError), what
    assert await inner.read("alice/o") == before
    assert await inner.list_executions() == ("alice/o",)

    keys.reachable = True
    assert [e.payload for e in await fresh.read("alice/o")] == [1]
    await fresh.append("alice/o", [NewEvent("K", 2)], expected_sequence=1)
    assert [e.payload for e in await store.read("alice/o")] == [1, 2]


async def test_a_tampered_ciphertext_is_refused(
    sealed: CryptoEventStore, inner: MemoryEventStore
) -> None:
    await sealed.append("alice/t", [NewEvent("X", {"v": 1})], expected_sequence=0)
    (stored,) = await inner.read("alice/t")
    assert isinstance(stored.payload, dict)
    ct = str(stored.payload["ct"])
    flipped = dict(stored.payload, ct=("B" if ct[0] == "A" else "A") + ct[1:])
    await inner.delete_execution("alice/t")
    await inner.append("alice/t", [NewEvent("X", flipped)], expected_sequence=0)
    with pytest.raises(PayloadAuthenticationError) as caught:
        await sealed.read("alice/t")
    assert (caught.value.execution_id, caught.value.sequence) == ("alice/t", 0)


@pytest.mark.parametrize(
    "envelope",
    [
        {SEALED_MARKER: 2, "kid": "k", "n": "AAAA", "ct": "AAAA"},
        {SEALED_MARKER: 1, "kid": "k", "n": "not base64!", "ct": "AAAA"},
        {SEALED_MARKER: 1, "kid": "k", "n": "AAAA"},
        {SEALED_MARKER: 1, "kid": "k", "n": "AAAAAAAAAAAAAAAA", "ct": "AAAA", "extra": 1},
    ],
)
async def test_a_malformed_envelope_is_refused(
    sealed: CryptoEventStore, inner: MemoryEventStore, envelope: dict[str, JsonValue]
) -> None:
    await inner.append("alice/m", [NewEvent("X", envelope)], expected_sequence=0)
    with pytest.raises(PayloadAuthenticationError):
        await sealed.read("alice/m")


async def test_append_many_and_append_if_unchanged_seal_for_their_sequences(
    sealed: CryptoEventStore, inner: MemoryEventStore
) -> None:
    await sealed.append("alice/1", [NewEvent("X", "a0")], expected_sequence=0)
    written = await sealed.append_many(
        [
            AppendRequest("alice/1", [NewEvent("X", "a1"), NewEvent("X", "a2")], 1),
            AppendRequest("bob/2", [NewEvent("X", "b0")], 0),
        ]
    )
    assert [[e.payload for e in batch] for batch in written] == [["a1", "a2"], ["b0"]]
    await sealed.append_if_unchanged(
        "bob/2", [NewEvent("X", "b1")], expected_sequence=1, observed_fence=0
    )
    assert [e.payload for e in await sealed.read("alice/1")] == ["a0", "a1", "a2"]
    assert [e.payload for e in await sealed.read("bob/2")] == ["b0", "b1"]
    assert all(isinstance(e.payload, dict) for e in await inner.read("bob/2"))


async def test_subscribe_opens_existing_then_live_events(sealed: CryptoEventStore) -> None:
    await sealed.append("alice/s", [NewEvent("X", 0), NewEvent("X", 1)], expected_sequence=0)
    stream = sealed.subscribe("alice/s", from_sequence=1)
    first = await anext(stream)
    await sealed.append("alice/s", [NewEvent("X", 2)], expected_sequence=2)
    second = await anext(stream)
    assert [(first.sequence, first.payload), (second.sequence, second.payload)] == [(1, 1), (2, 2)]
    await stream.aclose()  # type: ignore[attr-defined]


async def test_copy_prefix_is_refused_with_its_reason_and_others_follow_the_inner(
    key_store: KeyStore,
) -> None:
    full = CryptoEventStore(MemoryEventStore(), key_store=key_store, subject_of=subject_prefix)
    bare = CryptoEventStore(
        MemoryEventStore(offer=()), key_store=key_store, subject_of=subject_prefix
    )
    assert full.capabilities == set(OPTIONAL_EVENT_STORE_METHODS) - {"copy_prefix"}
    assert bare.capabilities == frozenset()
    with pytest.raises(Unsupported, match="bound to their execution id"):
        await full.copy_prefix("alice/a", "alice/b", through_sequence=0)
    with pytest.raises(Unsupported):
        bare.subscribe("alice/a")
    with pytest.raises(Unsupported):
        await bare.append_many([AppendRequest("alice/a", [NewEvent("X")], 0)])
    with pytest.raises(Unsupported):
        await bare.acquire_fence("alice/a")


async def test_branching_by_read_and_append_reseals_for_the_target(
    sealed: CryptoEventStore,
) -> None:
    source = [NewEvent("X", {"n": i}, {"step": i}) for i in range(3)]
    await sealed.append("alice/src", source, expected_sequence=0)
    prefix = await sealed.read("alice/src", to_sequence=1)
    await sealed.append(
        "alice/branch",
        [NewEvent(e.kind, e.payload, e.metadata) for e in prefix],
        expected_sequence=0,
    )
    assert [e.payload for e in await sealed.read("alice/branch")] == [{"n": 0}, {"n": 1}]


def test_the_subject_function_of_the_fixtures_is_what_the_tests_assume() -> None:
    assert subject_prefix("alice/x", NewEvent("X")) == "alice"
    assert subject_prefix("alice/x", NewEvent("X", metadata={"subject": "bob"})) == "bob"
    assert subject_prefix("public/x", NewEvent("X")) is None


# -- what a tag or a MAC binds ---------------------------------------------------------------


def test_the_bound_fields_are_encoded_exactly_as_canonical_json_would() -> None:
    from loom_crypto.sealing import bound_json

    from loom_core.spi import canonical_json

    # Every code point but the surrogates, in strings of 4,096, and the integers a sequence
    # and a format version take.
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    strings: list[JsonValue] = [
        "".join(points[i : i + 4096]) for i in range(0, len(points), 4096)
    ]
    integers: list[JsonValue] = [0, 1, 2, 9, 10, 2**31, 2**53 + 1, 2**63 - 1, -1, -(2**63)]
    fields: list[JsonValue] = ["loom-crypto", 2, "e\"\\\n\x00\x7f\u2028", 7, "K"]
    for bound in (strings, integers, fields):
        assert bound_json(bound) == canonical_json(bound).encode("utf-8")
    # What orjson refuses is written by canonical_json itself (and a lone surrogate,
    # which UTF-8 cannot hold, refused as it always was).
    beyond: list[list[JsonValue]] = [[2**64], [-(2**63) - 1]]
    for refused in beyond:
        assert bound_json(refused) == canonical_json(refused).encode("utf-8")
    with pytest.raises(UnicodeEncodeError):
        bound_json(["\ud800"])
