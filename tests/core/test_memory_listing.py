"""Listing the in-memory store's executions page by page costs what the pages hold: the
ids are sorted when the set of logs changed, not at every page."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import Any

import pytest

import loom_core.memory.events as memory_events
from loom_core import NewEvent
from loom_core.memory import MemoryEventStore


async def _every_id(store: MemoryEventStore, *, limit: int) -> list[str]:
    ids: list[str] = []
    while page := await store.list_executions(after=ids[-1] if ids else None, limit=limit):
        ids.extend(page)
    return ids


async def test_paging_through_many_executions_sorts_their_ids_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryEventStore()
    for i in range(1000):
        await store.append(f"e-{i:04d}", [NewEvent("k")], expected_sequence=0)
    sorted_ids = 0

    def counting_sorted(items: Iterable[Any], /, **kwargs: Any) -> list[Any]:
        nonlocal sorted_ids
        result = builtins.sorted(items, **kwargs)
        sorted_ids += len(result)
        return result

    monkeypatch.setattr(memory_events, "sorted", counting_sorted, raising=False)
    ids = await _every_id(store, limit=10)
    assert ids == [f"e-{i:04d}" for i in range(1000)]
    # A sort per page (101 pages) would sort 101,000 ids.
    assert sorted_ids <= 1000


async def test_a_listing_sees_the_logs_made_and_deleted_between_its_pages() -> None:
    store = MemoryEventStore()
    for name in ("a", "b", "c", "d"):
        await store.append(name, [NewEvent("k")], expected_sequence=0)
    assert await store.list_executions(limit=2) == ("a", "b")
    # As many logs as before, other ids: one deleted, one made.
    await store.delete_execution("c")
    await store.append("bb", [NewEvent("k")], expected_sequence=0)
    assert await store.list_executions(after="b", limit=10) == ("bb", "d")
    await store.copy_prefix("a", "aa", through_sequence=0)
    assert await _every_id(store, limit=2) == ["a", "aa", "b", "bb", "d"]
