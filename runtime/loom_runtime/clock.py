"""Where the runtime gets time and randomness: injectable, so tests are deterministic; and
the bounds of the time it computes with (:data:`MAX_DURATION`, :data:`LATEST_DEADLINE`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol, final, runtime_checkable

from typing_extensions import get_protocol_members

__all__ = ["LATEST_DEADLINE", "MAX_DURATION", "Clock", "RandomSource", "SystemClock"]

MAX_DURATION: Final = timedelta(days=365_250)
"""The longest wait the runtime takes (``ctx.sleep``, a ``ctx.receive`` timeout, a
``Retry`` interval): 1000 years. Fixed rather than counted from now, so a replay refuses
exactly what the first run refused; a longer one is a unit mistake, or a wait without end
(``ctx.receive`` without a timeout)."""

LATEST_DEADLINE: Final = datetime(9999, 1, 1, tzinfo=UTC)
"""No deadline falls later, and a :class:`~loom_runtime.testing.VirtualClock` goes no
further: the year left before ``datetime.max`` is room for what the runtime adds to a
deadline or to now (a timer's re-drive, its jitter) without overflowing."""


@runtime_checkable
class Clock(Protocol):
    """``now()`` is timezone-aware UTC; ``sleep`` waits on this clock's time.

    A clock that moves only when told (the test kit's
    :class:`~loom_runtime.testing.VirtualClock`) may also offer what the runtime then
    calls: ``attach(app)`` and ``detach(app)`` as an app enters and leaves,
    ``note_wake(wake_at)`` when a timer row is written, ``note_settled()`` when a run
    settles into waiting out retries' intervals, and ``tick(service)``, which a
    timer service awaits between polls instead of sleeping ``poll_interval``."""

    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


@runtime_checkable
class RandomSource(Protocol):
    """What the runtime draws from: ``random.Random`` is one."""

    def random(self) -> float: ...

    def getrandbits(self, k: int, /) -> int: ...


def lacking(value: object, protocol: type[Clock] | type[RandomSource]) -> list[str]:
    """The methods of ``protocol`` that ``value`` lacks, sorted; empty when it has them all.

    hasattr, not isinstance: from Python 3.12 on, isinstance() of a protocol looks
    attributes up statically, and so refuses a clock that forwards ``now`` and ``sleep``
    through ``__getattr__`` (a proxy around another clock), which it accepted before;
    hasattr accepts it on every version.
    """
    return sorted(m for m in get_protocol_members(protocol) if not hasattr(value, m))


@final
class SystemClock:
    """The wall clock and ``asyncio.sleep``."""

    __slots__ = ()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def shown(value: object) -> str:
    """``repr(value)`` for an error message, except an int too long to print (Python refuses
    to write one of more than 4300 digits), which is shown by its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    return repr(value)
