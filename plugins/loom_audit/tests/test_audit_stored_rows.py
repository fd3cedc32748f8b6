"""What the audit decorator hands the store below: pinned rows.

The rows a fixed input leaves in the inner store (links included) are pinned by digest,
alone and stacked with crypto either way round (its randomness made deterministic), so a
change in how the decorator builds what it writes (how it encodes the canonical JSON,
where it takes the predecessor's hash from) cannot change a link unnoticed.
"""

from __future__ import annotations

import pytest
from loom_audit import AuditEventStore, read_link
from loom_conformance.pinning import deterministic_randomness, rows_digest
from loom_crypto import CryptoEventStore, MemoryKeyStore

from loom_core import AppendRequest, EventStore, InvalidEventError, NewEvent
from loom_core.memory import MemoryEventStore

PINNED_DIGESTS = {
    "audit": "8dddf83cd17bdd290c8c236bce25680fc1e7fe9b47cfe521ee4aa7c078728635",
    "audit over crypto": "d573f96129bf58f5353e2afab4bef409748474f12c681cd3cdcdc69b348786a4",
    "crypto over audit": "1323ed8ceac8ebd6fe1c493eaac376ac33e99408aa5a7238e550eeedd5a66d06",
}
"""Written by the decorators before the canonical JSON went through orjson and before fenced
appends linked after a remembered tip; the crypto stacks' since a payload's JSON text keeps
its keys in the order given, when it holds an integer past 64 bits and in
``append_if_unchanged`` and ``append_many`` (it was sealed with the keys sorted)."""

IDS = ("alice/o-1", "alice/o-2", "public/p")


def subject_prefix(execution_id: str, event: NewEvent) -> str | None:
    owner = execution_id.split("/", 1)[0]
    return None if owner == "public" else owner


FIXED = [
    NewEvent("order.placed", {"items": [1, 2], "note": "crème brûlée"}, {"trace": "t1"}),
    NewEvent("order.priced", {"total": 12.5, "whole": 3.0, "big": 2**70}),
    NewEvent("order.noted", None, {"by": "bob"}),
    NewEvent("order.tagged", ["a", {"b": True}]),
    NewEvent("order.shipped", "parcel"),
]


async def write_fixed_input(store: EventStore) -> None:
    await store.append("alice/o-1", FIXED[:2], expected_sequence=0)
    token = await store.acquire_fence("alice/o-1")
    await store.append("alice/o-1", FIXED[2:3], expected_sequence=2, fence=token)
    await store.append_if_unchanged(
        "alice/o-1", FIXED[3:4], expected_sequence=3, observed_fence=token
    )
    public = await store.acquire_fence("public/p")
    await store.append_many([
        AppendRequest("alice/o-2", FIXED[4:], 0),
        AppendRequest("public/p", FIXED[:2], 0, public),
    ])


def stack(name: str, inner: EventStore) -> tuple[EventStore, AuditEventStore]:
    if name == "audit":
        audit = AuditEventStore(inner)
        return audit, audit
    if name == "crypto over audit":
        audit = AuditEventStore(inner)
        crypto = CryptoEventStore(audit, key_store=MemoryKeyStore(), subject_of=subject_prefix)
        return crypto, audit
    crypto = CryptoEventStore(inner, key_store=MemoryKeyStore(), subject_of=subject_prefix)
    audit = AuditEventStore(crypto)
    return audit, audit


@pytest.mark.parametrize("name", sorted(PINNED_DIGESTS))
async def test_the_rows_of_a_fixed_input_are_pinned_and_verify(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    deterministic_randomness(monkeypatch)
    inner = MemoryEventStore()
    top, audit = stack(name, inner)
    await write_fixed_input(top)
    rows = [event for execution_id in IDS for event in await inner.read(execution_id)]
    assert len(rows) == 7
    assert rows_digest(rows) == PINNED_DIGESTS[name]
    for execution_id in IDS:
        assert (await audit.verify(execution_id)).ok
    assert [(e.kind, e.payload, e.metadata) for e in await top.read("alice/o-1")] == [
        (e.kind, e.payload, {**e.metadata, **({"fence": 1} if i == 2 else {})})
        for i, e in enumerate(FIXED[:4])
    ]


async def test_the_links_still_cover_what_the_caller_wrote() -> None:
    inner = MemoryEventStore()
    audit = AuditEventStore(inner)
    await write_fixed_input(audit)
    stored = await audit.read_chained("alice/o-1")
    links = [read_link(e.metadata) for e in stored]
    assert all(link is not None for link in links)
    assert [link.prev for link in links if link is not None][1:] == [
        link.hash for link in links[:-1] if link is not None
    ]


@pytest.mark.parametrize(
    ("events", "match"),
    [
        ([NewEvent("k", 1), NewEvent("k", float("inf"))], r"events\[1\]\.payload is inf"),
        ([NewEvent("k", 1), NewEvent("k", 2, {"chain": 1})], r"events\[1\]\.metadata"),
    ],
)
async def test_a_bad_batch_is_refused_and_writes_nothing(
    events: list[NewEvent], match: str
) -> None:
    inner = MemoryEventStore()
    audit = AuditEventStore(inner)
    with pytest.raises(InvalidEventError, match=match):
        await audit.append("e", events, expected_sequence=0)
    with pytest.raises(InvalidEventError, match=match):
        await audit.append_many([AppendRequest("e", events, 0)])
    assert await inner.head("e") == 0
