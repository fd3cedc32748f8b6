"""The pinning helpers: repeatable draws, and a digest that any change to a row moves."""

from __future__ import annotations

import secrets

import pytest
from loom_conformance.pinning import deterministic_randomness, rows_digest

from loom_core import NewEvent
from loom_core.memory import MemoryEventStore

asyncio_test = pytest.mark.asyncio(loop_scope="function")


def test_the_draws_repeat_from_test_to_test(monkeypatch: pytest.MonkeyPatch) -> None:
    deterministic_randomness(monkeypatch)
    first = [secrets.token_bytes(12), secrets.token_hex(16), secrets.token_bytes()]
    with monkeypatch.context() as again:
        deterministic_randomness(again)
        assert [secrets.token_bytes(12), secrets.token_hex(16), secrets.token_bytes()] == first
    assert [len(first[0]), len(first[1]), len(first[2])] == [12, 32, 32]
    assert len(set(first)) == 3


@asyncio_test
async def test_the_digest_moves_with_every_field_of_a_row_but_the_clock() -> None:
    async def rows(kind: str = "k", payload: int = 1, metadata: str = "m") -> str:
        store = MemoryEventStore()
        await store.append("e", [NewEvent(kind, payload, {"x": metadata})], expected_sequence=0)
        return rows_digest(await store.read("e"))

    base = await rows()
    assert await rows() == base, "recorded_at is not covered"
    assert len({base, await rows(kind="j"), await rows(payload=2), await rows(metadata="n")}) == 4
