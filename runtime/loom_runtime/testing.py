"""A test kit for workflows: a virtual clock, crash injection, a replay check, and a child
process to SIGKILL.

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
import contextlib
import heapq
import itertools
import math
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, final

from loom_core import InvalidInputError
from loom_runtime.app import Loom
from loom_runtime.driver import Run
from loom_runtime.records import Position

__all__ = ["ChildProcess", "CrashAt", "VirtualClock", "check_replay", "crash_at"]


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


@final
class ChildProcess:
    """A process a kill test starts, reads line by line, SIGKILLs and reaps: a real death,
    not a simulated one. Its stdout is read as lines; its stderr goes to a file, whose
    tail a failing test can show (:meth:`stderr_tail`).

    ::

        worker = await ChildProcess.spawn(sys.executable, "worker.py", stderr=tmp / "w.err")
        try:
            assert await worker.line() == "started"
            await asyncio.sleep(random.uniform(0, 0.2))
            worker.kill()
        finally:
            worker.kill()
        assert await worker.finish() in (0, -signal.SIGKILL)
    """

    __slots__ = ("_process", "line_timeout", "lines", "stderr")

    def __init__(
        self, process: asyncio.subprocess.Process, stderr: Path, line_timeout: float
    ) -> None:
        self._process = process
        self.stderr = stderr
        self.line_timeout = line_timeout
        self.lines: list[str] = []
        """Every line read from its stdout so far."""

    @classmethod
    async def spawn(
        cls,
        *argv: str,
        stderr: Path,
        env: Mapping[str, str] | None = None,
        line_timeout: float = 60.0,
    ) -> ChildProcess:
        """Start ``argv`` with stdin closed, stdout piped and stderr to the file
        ``stderr``, in ``env`` (default: this process's environment). A line that takes
        longer than ``line_timeout`` seconds raises TimeoutError."""
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise InvalidInputError(
                f"argv must be one or more non-empty strs (the program, then its "
                f"arguments), not {argv!r}"
            )
        if not isinstance(stderr, Path):
            raise InvalidInputError(f"stderr= must be a pathlib.Path, not {stderr!r}")
        if (
            isinstance(line_timeout, bool)
            or not isinstance(line_timeout, int | float)
            or not math.isfinite(line_timeout)
            or line_timeout <= 0
        ):
            raise InvalidInputError(
                f"line_timeout= must be a finite number of seconds above 0, not "
                f"{line_timeout!r}"
            )
        with stderr.open("wb") as err:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=None if env is None else dict(env),
            )
        return cls(process, stderr, float(line_timeout))

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """None while it runs; ``-signal.SIGKILL`` once reaped after :meth:`kill`."""
        return self._process.returncode

    @property
    def killed(self) -> bool:
        """Whether it was reaped after a SIGKILL."""
        return self._process.returncode == -signal.SIGKILL

    async def line(self) -> str | None:
        """The next line of its stdout, without the newline; None once it is closed (the
        process exited or was killed)."""
        stdout = self._process.stdout
        assert stdout is not None
        raw = await asyncio.wait_for(stdout.readline(), self.line_timeout)
        if not raw:
            return None
        text = raw.decode(errors="replace").rstrip("\n")
        self.lines.append(text)
        return text

    def kill(self) -> None:
        """SIGKILL it, unless it has already been reaped; never raises."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGKILL)

    async def finish(self) -> int:
        """Read the rest of its stdout into :attr:`lines` and reap it; its exit code
        (negative: the signal that ended it)."""
        stdout = self._process.stdout
        assert stdout is not None
        rest = await asyncio.wait_for(stdout.read(), self.line_timeout)
        self.lines.extend(rest.decode(errors="replace").splitlines())
        return await asyncio.wait_for(self._process.wait(), self.line_timeout)

    def stderr_tail(self, limit: int = 4000) -> str:
        """The last ``limit`` characters of what it wrote to stderr ("" if nothing)."""
        if not self.stderr.exists():
            return ""
        return self.stderr.read_text(errors="replace").strip()[-limit:]
