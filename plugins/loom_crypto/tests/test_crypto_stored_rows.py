"""What the crypto decorator hands the store below: the rows of a fixed input, pinned.

The rows a fixed input leaves in the inner store are pinned by digest, with the key store's
and the sealer's randomness made deterministic, so a change in how the decorator builds
what it writes cannot change a seal, a MAC or an incarnation stamp unnoticed.
"""

from __future__ import annotations

import pytest
from conftest import subject_prefix
from loom_conformance.pinning import deterministic_randomness, rows_digest
from loom_crypto import CryptoEventStore, MemoryKeyStore

from loom_core import AppendRequest, InvalidEventError, NewEvent
from loom_core.memory import MemoryEventStore

PINNED_DIGEST = "5362a49a1275dc45cc76ec09dcac7cce695d95a95b1999d11cf3f1ca501348c1"
"""Written by the decorator as of loom-crypto 0.2 (each field as it was then), with a
payload's JSON text keeping its keys in the order given, when it holds an integer past 64
bits (``{"total": 12.5, "big": 2**70}``) and in ``append_if_unchanged`` and
``append_many`` (they were sealed with the keys sorted)."""


FIXED = [
    NewEvent("order.placed", {"items": [1, 2], "note": "crème brûlée"}, {"trace": "t1"}),
    NewEvent("order.priced", {"total": 12.5, "big": 2**70}),
    NewEvent("order.noted", None, {"subject": "bob"}),
    NewEvent("order.tagged", ["a", {"b": True}]),
    NewEvent("order.shipped", "parcel"),
]


async def write_fixed_input(store: CryptoEventStore) -> None:
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


async def test_the_rows_of_a_fixed_input_are_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    deterministic_randomness(monkeypatch)
    inner = MemoryEventStore()
    store = CryptoEventStore(inner, key_store=MemoryKeyStore(), subject_of=subject_prefix)
    await write_fixed_input(store)
    rows = [
        event
        for execution_id in ("alice/o-1", "alice/o-2", "public/p")
        for event in await inner.read(execution_id)
    ]
    assert len(rows) == 7
    assert rows_digest(rows) == PINNED_DIGEST
    assert [e.payload for e in await store.read("alice/o-1")] == [
        e.payload for e in FIXED[:4]
    ]


async def test_a_bad_event_is_refused_before_any_key_or_row_is_made() -> None:
    inner = MemoryEventStore()
    keys = MemoryKeyStore()
    store = CryptoEventStore(inner, key_store=keys, subject_of=subject_prefix)
    with pytest.raises(InvalidEventError, match=r"events\[1\]\.payload is inf"):
        await store.append(
            "alice/o-1", [NewEvent("k", 1), NewEvent("k", float("inf"))], expected_sequence=0
        )
    assert await inner.head("alice/o-1") == 0
    assert await keys.key_id_for("alice") is None
