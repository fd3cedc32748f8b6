from __future__ import annotations

import pytest

from loom_core import InvalidOptionError, Storage
from loom_core.demo import run_demo
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore


async def test_storage_refuses_objects_that_are_not_stores() -> None:
    with pytest.raises(InvalidOptionError, match="must implement TimerStore"):
        Storage(MemoryEventStore(), object(), MemoryLeaseStore())  # type: ignore[arg-type]


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
