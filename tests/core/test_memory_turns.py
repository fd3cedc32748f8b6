"""The in-memory stores let other tasks run: one call in YIELD_EVERY yields, the first
call of each store among them, and a call that raced close() is still refused."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import pytest

from loom_core import NewEvent, StoreClosedError, TimerRecord
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore
from loom_core.memory.turns import YIELD_EVERY

WAKE = datetime(2026, 1, 1, tzinfo=UTC)

Call = Callable[[int], Coroutine[Any, Any, object]]


def _events() -> tuple[Call, Callable[[], Awaitable[None]]]:
    store = MemoryEventStore()

    async def call(i: int) -> object:
        # Through both paths: the inlined single-event append and the general one.
        if i % 2:
            return await store.append(f"e-{i}", [NewEvent("A", {})], expected_sequence=0)
        return await store.head(f"e-{i}")

    return call, store.close


def _timers() -> tuple[Call, Callable[[], Awaitable[None]]]:
    store = MemoryTimerStore()

    async def call(i: int) -> object:
        await store.schedule(TimerRecord(f"t-{i}", WAKE))
        return None

    return call, store.close


def _leases() -> tuple[Call, Callable[[], Awaitable[None]]]:
    store = MemoryLeaseStore()

    async def call(i: int) -> object:
        return await store.inspect(f"l-{i}")

    return call, store.close


STORES = pytest.mark.parametrize(
    "make", [_events, _timers, _leases], ids=["events", "timers", "leases"]
)


async def _yielded(call: Call, i: int) -> bool:
    """Whether ``call(i)`` let the loop run a callback scheduled just before it."""
    ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(ran.set)
    await call(i)
    yielded = ran.is_set()
    await asyncio.sleep(0)  # the callback runs now if the call did not let it
    return yielded


@STORES
async def test_one_call_in_yield_every_lets_other_tasks_run(
    make: Callable[[], tuple[Call, Callable[[], Awaitable[None]]]],
) -> None:
    call, _ = make()
    yielded = [await _yielded(call, i) for i in range(4 * YIELD_EVERY)]
    assert [i for i, y in enumerate(yielded) if y] == [0, 16, 32, 48]


@STORES
async def test_a_task_calling_in_a_loop_never_starves_another(
    make: Callable[[], tuple[Call, Callable[[], Awaitable[None]]]],
) -> None:
    call, _ = make()
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(other())
    await asyncio.sleep(0)
    started = turns
    for i in range(10 * YIELD_EVERY):
        await call(i)
    ticker.cancel()
    assert turns - started == 10


@STORES
async def test_a_call_that_raced_close_is_refused(
    make: Callable[[], tuple[Call, Callable[[], Awaitable[None]]]],
) -> None:
    call, close = make()
    # The first call yields: close() runs in that turn, and the call is refused after it.
    racing: asyncio.Task[object] = asyncio.get_running_loop().create_task(call(0))
    await asyncio.sleep(0)
    await close()
    with pytest.raises(StoreClosedError):
        await racing
    with pytest.raises(StoreClosedError):
        await call(1)
