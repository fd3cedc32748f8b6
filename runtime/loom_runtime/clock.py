"""Where the runtime gets time and randomness: injectable, so tests are deterministic."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Protocol, final, runtime_checkable

__all__ = ["Clock", "RandomSource", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """``now()`` is timezone-aware UTC; ``sleep`` waits on this clock's time."""

    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


@runtime_checkable
class RandomSource(Protocol):
    """What the runtime draws from: ``random.Random`` is one."""

    def random(self) -> float: ...

    def getrandbits(self, k: int, /) -> int: ...


@final
class SystemClock:
    """The wall clock and ``asyncio.sleep``."""

    __slots__ = ()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
