"""Resumes racing inside one process: forced interleavings, never left to timing."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

from loom_runtime import Context, Loom, ResumeRefusedError
from loom_runtime.testing import VirtualClock

from loom_core import EventKind, Storage, open_storage


class _YieldingEvents:
    """The memory event store, giving the event loop a turn before every call (two before
    an append, as a write is slower than a lock), so two coroutines that use it interleave
    at every store call in the same order every time."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def capabilities(self) -> Any:
        return self._inner.capabilities

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if name.startswith("_") or not callable(method) or name == "subscribe":
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            for _ in range(2 if name == "append" else 1):
                await asyncio.sleep(0)
            return await method(*args, **kwargs)

        return call


async def test_two_resumes_of_one_park_in_one_process_answer_it_once() -> None:
    async with open_storage("memory://") as inner:
        storage = Storage(_YieldingEvents(inner.events), inner.timers, inner.leases)
        app = Loom(storage, node="n", clock=VirtualClock(), random=random.Random(1),
                   timers=False, recover=False)

        @app.workflow()
        async def waiting(ctx: Context) -> str:
            await ctx.sleep(timedelta(hours=1))
            return "woken"

        async with app:
            handle = await app.start(waiting, id="w")
            await app.drain()
            # Interleaved at every store call, each resumer would take the fence from the
            # other between its acquire and its append, until both gave up contended.
            outcomes = await asyncio.gather(
                app.resume("w", fence_if_parked_at=1),
                app.resume("w", fence_if_parked_at=1),
                return_exceptions=True,
            )
            assert outcomes[0] is None
            assert isinstance(outcomes[1], ResumeRefusedError)
            assert outcomes[1].reason == "not-suspended"
            assert await handle.result(timeout=5) == "woken"
            kinds = [e.kind for e in await storage.events.read("w")]
            assert kinds.count(EventKind.EXECUTION_RESUMED) == 1
