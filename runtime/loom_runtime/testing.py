"""A test kit for workflows: a virtual clock, crash injection, and a replay check.

::

    from random import Random
    from loom_runtime import Loom
    from loom_runtime.testing import VirtualClock, check_replay, crash_at

    clock = VirtualClock()
    app = Loom("memory://", clock=clock, random=Random(7), node="test")
    async with app:
        crash = crash_at(app, step="charge_card", when="after")   # die right after it
        handle = await app.start(checkout, "o-1")
        await crash.fired.wait()
        await app.recover()                 # what the restarted process does
        await clock.advance(30)             # due timers fire
        assert await handle.result() == ...
        await check_replay(app)             # every finished execution replays cleanly
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, final

from loom_core import InvalidInputError
from loom_runtime.app import Loom
from loom_runtime.driver import Run
from loom_runtime.records import Position

__all__ = ["CrashAt", "VirtualClock", "check_replay", "crash_at"]


@final
class VirtualClock:
    """A clock that moves only when told: :meth:`advance` wakes every sleeper whose time
    has come, in order, and lets the event loop run what they woke."""

    __slots__ = ("_counter", "_now", "_sleepers")

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.utcoffset() is None:
            raise InvalidInputError("VirtualClock(start=...) must be timezone-aware")
        self._now = (start or datetime(2030, 1, 1, tzinfo=UTC)).astimezone(UTC)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    def now(self) -> datetime:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        deadline = self._now + timedelta(seconds=seconds)
        heapq.heappush(self._sleepers, (deadline, next(self._counter), future))
        await future

    async def advance(self, by: float | timedelta) -> None:
        """Move time forward by ``by`` (seconds or a timedelta)."""
        step = by if isinstance(by, timedelta) else timedelta(seconds=by)
        if step < timedelta(0):
            raise InvalidInputError(f"a clock moves forward only, not by {by!r}")
        target = self._now + step
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not future.done():
                future.set_result(None)
            await _settle()
        self._now = target
        await _settle()


async def _settle(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@dataclass(slots=True)
class CrashAt:
    """Kill the run at a durable call, as a process death would: the run appends nothing
    more and vanishes; the log keeps it running under this node until
    :meth:`Loom.recover` (what a restarted process does) drives it on.

    Match by ``step`` name (the step's name, or its last dotted part), or ``position`` (the
    body's k-th call), or ``step="park"`` for the moment before a park is written, or
    ``step="continue"`` for ``ctx.continue_as_new`` (``"before"``: its successor is
    created and EXECUTION_CONTINUED not yet written; ``"after"``: written, and the
    successor not yet driven); ``when`` is ``"before"`` the call runs or ``"after"`` its
    record is durable (while a crash point is armed, a step's result is written as the
    step returns, not with the run's next write, so there is such a moment).
    """

    step: str | None = None
    position: int | Position | None = None
    when: Literal["before", "after"] = "before"
    execution_id: str | None = None
    times: int = 1
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    count: int = 0

    def __call__(self, execution_id: str, position: Position, name: str, when: str) -> bool:
        if self.count >= self.times or when != self.when:
            return False
        if self.execution_id is not None and execution_id != self.execution_id:
            return False
        if self.step is not None and not (name == self.step or name.endswith("." + self.step)):
            return False
        if self.position is not None:
            wanted = (self.position,) if isinstance(self.position, int) else self.position
            if position != wanted:
                return False
        self.count += 1
        self.fired.set()
        return True


def crash_at(
    app: Loom,
    *,
    step: str | None = None,
    position: int | Position | None = None,
    when: Literal["before", "after"] = "before",
    execution_id: str | None = None,
    times: int = 1,
) -> CrashAt:
    """Arm a :class:`CrashAt` on ``app``."""
    if when not in ("before", "after"):
        raise InvalidInputError(f"when= is 'before' or 'after', not {when!r}")
    if step is None and position is None:
        raise InvalidInputError("crash_at needs step= or position=")
    point = CrashAt(step, position, when, execution_id, times)
    app.crash_points.append(point)
    return point


async def check_replay(app: Loom, execution_ids: Iterable[str] | None = None) -> list[str]:
    """Replay every finished execution (or those named) against the app's current code,
    appending nothing; raise ReplayDivergedError at the first that no longer matches its
    log. Returns the ids replayed."""
    storage = app.storage
    if execution_ids is None:
        ids: list[str] = []
        after: str | None = None
        while page := await storage.events.list_executions(after=after, limit=100):
            ids.extend(i for i in page if not i.startswith("$"))
            after = page[-1]
    else:
        ids = list(execution_ids)
    replayed: list[str] = []
    for execution_id in ids:
        view = await app.inspect(execution_id)
        if not view.terminal:
            continue
        fn = app._body_of(view)
        outcome = await Run(app, view, view.fence, fn, replay_only=True).drive()
        if outcome.kind == "stopped" and outcome.reason is not None:
            raise outcome.reason
        replayed.append(execution_id)
    return replayed
