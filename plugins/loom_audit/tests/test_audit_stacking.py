"""Crypto above the audit chain (the documented order), and what the other order does.

``open_storage(url, decorators=["audit", ("crypto", ...)])`` (innermost first): crypto
seals, then the chain links the sealed events, so the chain covers ciphertext. It then
verifies with no key at all and survives shredding, whose markers it chains too.

The other order (``[("crypto", ...), "audit"]``) chains plaintext: verifying needs every
key, a shredded subject makes its log unverifiable, the shred markers are written below the
chain and so are unchained, and the plaintext hashes left in the metadata let anyone
confirm a guessed payload after the erasure.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from loom_audit import AuditEventStore, ChainBroken, find_audit_store, link_hash, read_link
from loom_crypto import (
    INCARNATION_FIELD,
    SEALED_MARKER,
    CryptoEventStore,
    MemoryKeyStore,
    PayloadAuthenticationError,
    shred_subject,
)

from loom_core import (
    EventKind,
    EventStore,
    JsonValue,
    NewEvent,
    PayloadShreddedError,
    Storage,
    open_storage,
)

BACKENDS = ["memory", "sqlite", "postgresql"]


def _owner(execution_id: str, event: NewEvent) -> str:
    return execution_id.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class Backend:
    url: str
    options: dict[str, object]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    name: str = request.param
    if name == "sqlite":
        return Backend(f"sqlite:///{tmp_path / 'loom.db'}", {})
    if name == "postgresql":
        # Requested only here, so memory and SQLite runs never start a server.
        database: str = request.getfixturevalue("stack_database")
        return Backend(database, {"schema": f"stack_{uuid.uuid4().hex[:12]}"})
    return Backend("memory://", {})


@pytest.fixture
async def documented(backend: Backend) -> AsyncIterator[Storage]:
    crypto = ("crypto", {"key_store": MemoryKeyStore(), "subject_of": _owner})
    async with open_storage(
        backend.url, decorators=["audit", crypto], options=backend.options
    ) as storage:
        yield storage


@pytest.fixture
async def reversed_order(backend: Backend) -> AsyncIterator[Storage]:
    crypto = ("crypto", {"key_store": MemoryKeyStore(), "subject_of": _owner})
    async with open_storage(
        backend.url, decorators=[crypto, "audit"], options=backend.options
    ) as storage:
        yield storage


async def _populate(events: EventStore) -> None:
    token = await events.acquire_fence("alice/1")
    await events.append(
        "alice/1",
        [NewEvent(EventKind.EXECUTION_STARTED, {"card": "4111"}),
         NewEvent(EventKind.STEP_COMPLETED, {"charged": 10})],
        expected_sequence=0,
        fence=token,
    )
    await events.append("bob/1", [NewEvent(EventKind.EXECUTION_STARTED, {"bob": 1})],
                        expected_sequence=0)


def _below(storage: Storage) -> EventStore:
    """The store under both decorators: the rows as the database holds them."""
    audit = find_audit_store(storage)
    return audit.inner


async def test_the_documented_order_chains_ciphertext(documented: Storage) -> None:
    assert isinstance(documented.events, CryptoEventStore)
    assert isinstance(documented.events.inner, AuditEventStore)
    await _populate(documented.events)
    rows = await _below(documented).read("alice/1")
    for row in rows:
        assert isinstance(row.payload, dict)
        assert SEALED_MARKER in row.payload
        link = read_link(row.metadata)
        assert link is not None
        assert link.hash == link_hash(row.execution_id, row.sequence, row.kind, row.payload,
                                      row.metadata, link.prev)
    assert [e.payload for e in await documented.events.read("alice/1")] == [
        {"card": "4111"}, {"charged": 10}
    ]


async def test_the_chain_verifies_without_keys_and_survives_shredding(documented: Storage) -> None:
    await _populate(documented.events)
    result = await shred_subject(documented, "alice")
    assert result.executions == ("alice/1",)
    with pytest.raises(PayloadShreddedError):
        await documented.events.read("alice/1")
    assert [e.payload for e in await documented.events.read("bob/1")] == [{"bob": 1}]

    # A verifier holding no key at all: an audit decorator straight over the rows.
    keyless = AuditEventStore(_below(documented))
    verified = await keyless.verify("alice/1")
    assert verified.ok
    assert verified.last_sequence == 3  # two sealed events, ERASURE_PENDING, PAYLOAD_SHREDDED
    kinds = [e.kind for e in await keyless.read_chained("alice/1")]
    assert kinds[-2:] == [EventKind.ERASURE_PENDING, EventKind.PAYLOAD_SHREDDED]
    head = await keyless.export_head("alice/1")
    assert (await find_audit_store(documented).verify("alice/1", head=head)).ok


async def test_a_moved_ciphertext_is_caught_by_both_layers(documented: Storage) -> None:
    await _populate(documented.events)
    rows = list(await _below(documented).read("alice/1"))
    below = _below(documented)
    # Swap the two sealed payloads, links untouched. Through the store this needs a delete,
    # after which the rows' old token is stale, so they go back unfenced (a tamperer with
    # the database could keep the stamp; the swap breaks the first link either way).
    await below.delete_execution("alice/1")
    await below.append(
        "alice/1",
        [NewEvent(rows[0].kind, rows[1].payload,
                  {k: v for k, v in rows[0].metadata.items() if k != "fence"}),
         NewEvent(rows[1].kind, rows[0].payload,
                  {k: v for k, v in rows[1].metadata.items() if k != "fence"})],
        expected_sequence=0,
    )
    broken = await find_audit_store(documented).verify("alice/1")
    assert isinstance(broken, ChainBroken)
    assert (broken.sequence, broken.reason) == (0, "content")
    with pytest.raises(PayloadAuthenticationError):
        await documented.events.read("alice/1")


async def test_the_other_order_chains_plaintext_and_breaks_on_shredding(
    reversed_order: Storage,
) -> None:
    assert isinstance(reversed_order.events, AuditEventStore)
    await _populate(reversed_order.events)
    assert (await reversed_order.events.verify("alice/1")).ok

    await shred_subject(reversed_order, "alice")
    result = await reversed_order.events.verify("alice/1")
    assert isinstance(result, ChainBroken)
    assert (result.sequence, result.reason) == (0, "unreadable")
    assert "below crypto" in result.detail
    # The shred markers went in below the chain: unchained.
    crypto = reversed_order.events.inner
    assert isinstance(crypto, CryptoEventStore)
    rows = await crypto.read_sealed("alice/1")
    assert [read_link(e.metadata) for e in rows[-2:]] == [None, None]
    assert (await reversed_order.events.verify("bob/1")).ok


async def test_the_other_order_lets_a_guess_be_confirmed_after_erasure(
    reversed_order: Storage,
) -> None:
    assert isinstance(reversed_order.events, AuditEventStore)
    await _populate(reversed_order.events)
    await shred_subject(reversed_order, "alice")
    crypto = reversed_order.events.inner
    assert isinstance(crypto, CryptoEventStore)
    first = (await crypto.read_sealed("alice/1"))[0]
    link = read_link(first.metadata)
    assert link is not None

    # The chain saw the metadata as crypto shows it: without its incarnation stamp.
    seen = {k: v for k, v in first.metadata.items() if k != INCARNATION_FIELD}

    def confirms(guess: JsonValue) -> bool:
        return link_hash("alice/1", 0, first.kind, guess, seen, link.prev) == link.hash

    assert confirms({"card": "4111"})
    assert not confirms({"card": "4242"})


async def test_clear_payloads_are_authenticated_on_every_backend(backend: Backend) -> None:
    # subject_of None: the payload is stored in the clear, as JSON text under a MAC, so a
    # store's JSON type (PostgreSQL jsonb turns 1.0 into 1) cannot break the MAC.
    crypto = ("crypto", {"key_store": MemoryKeyStore(), "subject_of": lambda e, ev: None})
    payload: JsonValue = {"amount": 1.0, "big": 1e20, "text": "é\u2028", "n": [1, 2.5]}
    async with open_storage(
        backend.url, decorators=["audit", crypto], options=backend.options
    ) as storage:
        await storage.events.append("open/1", [NewEvent("X", payload)], expected_sequence=0)
        await storage.events.append("open/1", [NewEvent("Y", None)], expected_sequence=1)
        (first, second) = await storage.events.read("open/1")
        assert (first.payload, second.payload) == (payload, None)
        assert isinstance(first.payload, dict)
        assert isinstance(first.payload["amount"], float)
        assert (await find_audit_store(storage).verify("open/1")).ok
        below = _below(storage)
        rows = await below.read("open/1")
        await below.delete_execution("open/1")
        await below.append(
            "open/1",
            [NewEvent(r.kind, {"amount": 1000} if r.sequence == 0 else r.payload,
                      {k: v for k, v in r.metadata.items() if k != "fence"}) for r in rows],
            expected_sequence=0,
        )
        with pytest.raises(PayloadAuthenticationError):
            await storage.events.read("open/1")
