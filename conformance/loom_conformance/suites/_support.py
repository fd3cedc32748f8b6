"""Helpers the suites share: building events, snapshots, tokens and parks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import pytest

from loom_core import (
    Event,
    EventKind,
    EventStore,
    FenceAcquired,
    JsonValue,
    NewEvent,
)

__all__ = [
    "GUARD_SECONDS",
    "Snapshot",
    "app",
    "bump_token",
    "close_iterator",
    "guard",
    "kernel",
    "park",
    "snapshot",
]

GUARD_SECONDS: Final = 10.0
"""How long a test waits for something that must happen before calling the store hung.
A guard against hanging the run, never an assertion about speed."""

_T = TypeVar("_T")


def kernel(kind: EventKind, payload: JsonValue = None) -> NewEvent:
    return NewEvent(kind.value, payload)


def app(kind: str = "order.placed", payload: JsonValue = None, **metadata: JsonValue) -> NewEvent:
    return NewEvent(kind, payload, metadata)


async def guard(awaitable: Awaitable[_T]) -> _T:
    return await asyncio.wait_for(awaitable, GUARD_SECONDS)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a caller can observe of an event store through the required methods."""

    executions: tuple[str, ...]
    heads: tuple[int, ...]
    logs: tuple[tuple[Event, ...], ...]


async def snapshot(store: EventStore, *also: str) -> Snapshot:
    """The listed executions (plus ``also``, which may not exist) with heads and logs."""
    listed: list[str] = []
    after: str | None = None
    while True:
        page = await store.list_executions(after=after, limit=100)
        listed.extend(page)
        if len(page) < 100:
            break
        after = page[-1]
    ids = sorted({*listed, *also})
    heads = tuple([await store.head(i) for i in ids])
    logs = tuple([await store.read(i) for i in ids])
    return Snapshot(tuple(listed), heads, logs)


async def bump_token(store: EventStore, execution_id: str) -> int:
    """Raise the execution's token by one with whichever acquire the store offers."""
    if "acquire_fence" in store.capabilities:
        return await store.acquire_fence(execution_id)
    if "acquire_fence_if" not in store.capabilities:
        pytest.skip("the store offers neither acquire_fence nor acquire_fence_if")
    # Past the head nothing can answer, so only the token decides; learn it from a stale.
    park_seq = await store.head(execution_id)
    result = await store.acquire_fence_if(execution_id, fence=0, park_seq=park_seq)
    if not isinstance(result, FenceAcquired):
        result = await store.acquire_fence_if(execution_id, fence=result.fence, park_seq=park_seq)
    assert isinstance(result, FenceAcquired), f"acquire_fence_if with the current token: {result}"
    return result.fence


async def park(
    store: EventStore, execution_id: str, *, fence: int | None = None,
    before: Sequence[NewEvent] = (),
) -> int:
    """Start ``execution_id`` and park it (EXECUTION_SUSPENDED, written under ``fence``);
    return the park's sequence."""
    head = await store.head(execution_id)
    events = [kernel(EventKind.EXECUTION_STARTED), *before] if head == 0 else list(before)
    events.append(kernel(EventKind.EXECUTION_SUSPENDED, {"waiting_on": "signal"}))
    written = await store.append(execution_id, events, expected_sequence=head, fence=fence)
    return written[-1].sequence


async def close_iterator(iterator: AsyncIterator[Event]) -> None:
    """Close a subscription (an async generator has ``aclose``; a plain iterator has not)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
