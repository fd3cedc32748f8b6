from __future__ import annotations

import pytest

from loom_core import InvalidOptionError, Storage
from loom_core.demo import run_demo
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore


async def test_storage_refuses_objects_that_are_not_stores() -> None:
    with pytest.raises(InvalidOptionError, match="must implement TimerStore"):
        Storage(MemoryEventStore(), object(), MemoryLeaseStore())  # type: ignore[arg-type]


async def test_storage_refusing_a_store_names_the_methods_it_lacks() -> None:
    class HalfStore:
        async def append(self) -> None: ...

        async def read(self) -> None: ...

    with pytest.raises(InvalidOptionError) as caught:
        Storage(HalfStore(), MemoryTimerStore(), MemoryLeaseStore())  # type: ignore[arg-type]
    message = str(caught.value)
    assert "HalfStore lacks" in message
    for lacking in ("head", "list_executions", "capabilities", "acquire_fence", "subscribe"):
        assert lacking in message
    assert "append," not in message
    assert "read," not in message
    assert "RefusesUnoffered" in message


class Forwarding:
    """A proxy that forwards every attribute to the store it wraps (a test double)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


async def test_storage_takes_a_store_that_forwards_through_getattr_on_every_python() -> None:
    # isinstance() of a protocol refuses such a proxy from Python 3.12 on; Storage does not.
    storage = Storage(
        Forwarding(MemoryEventStore()),  # type: ignore[arg-type]
        Forwarding(MemoryTimerStore()),  # type: ignore[arg-type]
        Forwarding(MemoryLeaseStore()),  # type: ignore[arg-type]
    )
    async with storage:
        assert await storage.events.head("e") == 0


async def test_storage_close_closes_every_store_when_one_fails() -> None:
    closed: list[str] = []

    class FailingEvents(MemoryEventStore):
        async def close(self) -> None:
            closed.append("events")
            raise RuntimeError("disk gone")

    class CountingTimers(MemoryTimerStore):
        async def close(self) -> None:
            closed.append("timers")

    async def on_close() -> None:
        closed.append("pool")

    storage = Storage(FailingEvents(), CountingTimers(), MemoryLeaseStore(), on_close=on_close)
    with pytest.raises(RuntimeError, match="disk gone"):
        await storage.close()
    assert closed == ["events", "timers", "pool"]


async def test_storage_close_runs_on_close_once() -> None:
    calls: list[str] = []

    async def on_close() -> None:
        calls.append("closed")

    storage = Storage(MemoryEventStore(), MemoryTimerStore(), MemoryLeaseStore(), on_close=on_close)
    async with storage:
        pass
    await storage.close()
    assert calls == ["closed"]


async def test_demo_resumes_once_and_fences_the_zombie_out() -> None:
    lines: list[str] = []
    log = await run_demo("memory://", say=lines.append)
    kinds = [e.kind for e in log]
    assert kinds == [
        "EXECUTION_STARTED",
        "STEP_COMPLETED",
        "EXECUTION_SUSPENDED",
        "EXECUTION_DENIED",
        "EXECUTION_RESUMED",
        "EXECUTION_COMPLETED",
    ]
    assert [e.fence for e in log] == [1, 1, 1, 0, 3, 3]
    assert any("zombie A refused" in line for line in lines)
    assert [e.sequence for e in log] == list(range(6))
