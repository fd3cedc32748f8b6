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
        await asyncio.wait_for(crash.fired.wait(), 10)  # bounded: an unreached point never fires
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
from typing import Any, Final, Literal, final

from loom_core import InvalidInputError
from loom_runtime.app import Loom
from loom_runtime.clock import LATEST_DEADLINE, shown
from loom_runtime.driver import Run
from loom_runtime.errors import InvalidDurationError, WorkflowNotFoundError
from loom_runtime.records import Position, check_text
from loom_runtime.timers import TimerService

__all__ = ["ChildProcess", "CrashAt", "VirtualClock", "check_replay", "crash_at"]


@final
class VirtualClock:
    """A clock that moves only when told: :meth:`advance` steps from one instant something
    waits for to the next (a due timer row, a retry's interval, a contended wake's next
    try), fires what is due there, and lets what that woke run until every app on the
    clock is quiet again, before it moves on.

    "Quiet" means each run of each app on this clock (``Loom(clock=...)``, entered, with
    its timer service: an app made with ``timers=False`` is polled by its test, and this
    clock only moves its time) has
    finished or parked, or each of its branches waits out a retry's interval on this
    clock: so ``ctx.now()`` in a body woken at 10:00:30 reads 10:00:30 however far the
    advance goes, a timer its body then sets inside the advance fires too, and when
    ``advance`` returns, what fell due has happened. Steps are waited for, as in
    Temporal's time-skipping tests: a step that awaits something your test provides
    (an event it sets) holds the advance until it has it, so provide it first, or
    advance from a task of its own. The apps'
    timer services poll at each instant it stops at, and only then, however long the
    step: an advance of a month costs what the instants in it cost, not a poll every
    ``poll_interval``.

    It runs from ``start`` (a timezone-aware datetime; 2030-01-01 UTC by default) up to
    ``LATEST_DEADLINE`` (9999-01-01 UTC), the latest deadline the runtime keeps; a start
    or an advance past that is refused, and a sleep that would end past it never ends.
    """

    __slots__ = (
        "_advancing", "_apps", "_counter", "_now", "_nudges", "_sleepers", "_ticking", "_wakes"
    )

    def __init__(self, start: datetime | None = None) -> None:
        self._now = datetime(2030, 1, 1, tzinfo=UTC) if start is None else _start(start)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()
        self._apps: list[Loom] = []
        self._nudges: list[asyncio.Future[None]] = []
        self._wakes: list[datetime] = []  # a heap: when the timer rows written fall due
        self._ticking: dict[TimerService, asyncio.Future[None]] = {}
        self._advancing: asyncio.Future[None] | None = None  # the advance under way

    def now(self) -> datetime:
        return self._now

    # -- what the runtime calls on a clock like this one -----------------------------------

    def attach(self, app: Loom) -> None:
        """An app on this clock entered: :meth:`advance` waits for its runs."""
        if app not in self._apps:
            self._apps.append(app)

    def detach(self, app: Loom) -> None:
        """An app on this clock left."""
        if app in self._apps:
            self._apps.remove(app)

    def note_settled(self) -> None:
        """A run settled (every branch left waits out a retry's interval on this clock):
        an advance waiting for it to settle looks again."""
        self._nudge()

    def note_wake(self, wake_at: datetime) -> None:
        """A timer row was written: :meth:`advance` stops when it falls due."""
        if wake_at > self._now:
            heapq.heappush(self._wakes, wake_at)

    async def tick(self, service: TimerService) -> None:
        """A timer service waits here for the next instant :meth:`advance` stops at."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ticking[service] = future
        self._nudge()
        try:
            await future
        finally:
            if self._ticking.get(service) is future:
                del self._ticking[service]

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds``; at once for 0 or less,
        never for a sleep that would end past ``LATEST_DEADLINE`` (or an infinite one)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds != seconds:
            raise InvalidDurationError(
                f"VirtualClock.sleep takes a number of seconds, not {shown(seconds)}"
            )
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        step = _timedelta(seconds)
        if step is not None and step <= LATEST_DEADLINE - self._now:
            heapq.heappush(self._sleepers, (self._now + step, next(self._counter), future))
        self._nudge()  # a run that waits here may be all an advance is waiting for
        await future  # unscheduled (the clock never gets there), it ends only when cancelled

    async def advance(self, by: float | timedelta) -> None:
        """Move time forward by ``by`` (seconds or a timedelta), stopping at each instant
        something waits for on the way (see the class docstring). An advance called while
        another is under way (from a task of its own) waits for it to return, then moves
        on from where it ended: the clock never goes back, and each instant is reached
        once.

        Refused (InvalidDurationError, nothing moved): anything but an int, a float or a
        timedelta; NaN; a negative step; one that would move the clock past
        ``LATEST_DEADLINE``.
        """
        if isinstance(by, timedelta):
            step: timedelta | None = by
        elif isinstance(by, int | float) and not isinstance(by, bool) and by == by:
            step = _timedelta(by) if by >= 0 else timedelta(-1)
        else:
            raise InvalidDurationError(
                f"clock.advance takes seconds (int or float, not NaN) or a timedelta, not "
                f"{shown(by)}"
            )
        if step is not None and step < timedelta(0):
            raise InvalidDurationError(f"a clock moves forward only, not by {shown(by)}")
        while self._advancing is not None:
            await asyncio.shield(self._advancing)
        if step is None or step > LATEST_DEADLINE - self._now:
            raise InvalidDurationError(
                f"clock.advance({shown(by)}) would move the clock past "
                f"{LATEST_DEADLINE.isoformat()}, the latest deadline the runtime keeps (it "
                f"reads {self._now.isoformat()}); advance by less"
            )
        target = self._now + step
        advancing = self._advancing = asyncio.get_running_loop().create_future()
        try:
            await self._quiet()
            while (instant := self._next_instant(target)) is not None:
                self._now = instant
                while self._wakes and self._wakes[0] <= instant:
                    heapq.heappop(self._wakes)
                while self._sleepers and self._sleepers[0][0] <= instant:
                    _, _, future = heapq.heappop(self._sleepers)
                    if not future.done():
                        future.set_result(None)
                await self._fire()
            self._now = target
            await self._fire()
        finally:
            self._advancing = None
            advancing.set_result(None)

    def _next_instant(self, target: datetime) -> datetime | None:
        """The first instant after now and no later than ``target`` that something waits
        for: a sleeper, a timer row written, a contended wake's next try."""
        now = self._now
        instants = [self._sleepers[0][0]] if self._sleepers else []
        if self._wakes:
            instants.append(self._wakes[0])
        for app in self._apps:
            if app.serves_timers:
                instants.extend(app.timer_service.next_tries())
        later = [instant for instant in instants if now < instant <= target]
        return min(later) if later else None

    async def _fire(self) -> None:
        """Let what woke run; then have every timer service on this clock poll at this
        instant, again while a poll resumes something (a body woken here may set a timer
        due here, and a backlog of rows due here takes a poll a batch), and let what each
        poll woke run. Polls that resume only executions already resumed at this instant
        (a body that sets a timer due at once, again and again) stop after
        ``_POLLS_PER_INSTANT``: a backlog of any size is fired before the clock moves on."""
        await self._quiet()
        woken: set[str] = set()
        repeats = 0
        while repeats < _POLLS_PER_INSTANT:
            ticking, self._ticking = self._ticking, {}
            for future in ticking.values():
                if not future.done():
                    future.set_result(None)
            await self._quiet()
            resumed = {
                row.execution_id
                for service in ticking
                for row, what in service.last_fired.items()
                if what in ("resumed", "timed-out")
            }
            if not resumed:
                return
            if resumed <= woken:
                repeats += 1
            woken |= resumed

    async def _quiet(self) -> None:
        """Wait until nothing on this clock makes progress (see the class docstring): the
        loop runs what is ready, and each busy task is waited for until it ends or waits
        on this clock (a timer service polling counts as busy until it waits again)."""
        await _settle()
        loop = asyncio.get_running_loop()
        while busy := self._busy():
            nudge: asyncio.Future[None] = loop.create_future()
            self._nudges.append(nudge)
            await asyncio.wait([*busy, nudge], return_when=asyncio.FIRST_COMPLETED)
            await _settle()

    def _busy(self) -> list[asyncio.Task[Any]]:
        busy: list[asyncio.Task[Any]] = []
        for app in self._apps:
            if not app.serves_timers:
                continue  # its test polls its timers itself, and waits as it sees fit
            busy.extend(app.busy())
            task = app.timer_task
            if task is not None and not task.done() and app.timer_service not in self._ticking:
                busy.append(task)
        return busy

    def _nudge(self) -> None:
        nudges, self._nudges = self._nudges, []
        for nudge in nudges:
            if not nudge.done():
                nudge.set_result(None)


_POLLS_PER_INSTANT: Final = 100
"""How often an advance polls at one instant while each poll resumes only executions it
resumed there already: a body that sets a timer due at once, again and again, stops
holding the clock after these."""


def _start(start: object) -> datetime:
    """A VirtualClock's ``start=``, in UTC."""
    if not isinstance(start, datetime) or start.utcoffset() is None:
        raise InvalidInputError(
            f"VirtualClock(start=...) must be a timezone-aware datetime, not {start!r}; "
            "e.g. datetime(2030, 1, 1, tzinfo=UTC)"
        )
    now: datetime | None
    try:
        now = start.astimezone(UTC)
    except OverflowError:  # in UTC, before datetime.min or after datetime.max
        now = None
    if now is None or now > LATEST_DEADLINE:
        raise InvalidInputError(
            f"VirtualClock(start={start!r}) must fall, in UTC, between datetime.min and "
            f"{LATEST_DEADLINE.isoformat()}, the latest deadline the runtime keeps"
        )
    return now


def _is_position(value: object) -> bool:
    def index(part: object) -> bool:
        return isinstance(part, int) and not isinstance(part, bool) and part >= 0

    if isinstance(value, tuple):
        return bool(value) and all(index(part) for part in value)
    return index(value)


def _timedelta(seconds: float) -> timedelta | None:
    """``timedelta(seconds=seconds)``, or None when no timedelta is that long."""
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        return None


async def _settle(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@dataclass(slots=True)
class CrashAt:
    """Kill the run at a durable call, as a process death would: the run appends nothing
    more and vanishes; the log keeps it running under this node until
    :meth:`Loom.recover` (what a restarted process does) drives it on.

    Match by ``step`` name (the step's name, or its last dotted part), or ``position`` (a
    step's position: the body's k-th call, which must be a step), or ``step="park"`` for
    the moment before a park is written, or
    ``step="continue"`` for ``ctx.continue_as_new`` (``"before"``: its successor is
    created and EXECUTION_CONTINUED not yet written; ``"after"``: written, and the
    successor not yet driven); ``when`` is ``"before"`` the call runs, ``"unrecorded"``
    once a step's attempt has ended (returned or raised) and before anything of it is
    written (the death that makes a step at least once: recovery makes the attempt again),
    or ``"after"`` its record is durable (while a crash point is armed, a step's result is
    written as the step returns, not with the run's next write, so there is such a moment).

    Refused (InvalidInputError), as a point that could never fire: neither ``step`` nor
    ``position``; a ``step`` or ``execution_id`` that is not a non-empty str; a
    ``position`` that is not an int >= 0 or a non-empty tuple of them (the body's first
    call is 0); ``when`` other than ``"before"``, ``"unrecorded"`` or ``"after"``;
    ``step="park"`` with ``"after"`` (the park is a moment before a write); ``step="park"``
    or ``"continue"`` with ``"unrecorded"`` (a step's moment); ``step="park"`` or
    ``"continue"`` with ``position``; a ``step`` or ``execution_id`` with U+0000 or a
    lone surrogate; ``times`` below 1.
    """

    step: str | None = None
    position: int | Position | None = None
    when: Literal["before", "unrecorded", "after"] = "before"
    execution_id: str | None = None
    times: int = 1
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    count: int = 0

    def __post_init__(self) -> None:
        if self.step is None and self.position is None:
            raise InvalidInputError("a crash point needs step= or position=")
        if self.step is not None and (not isinstance(self.step, str) or not self.step):
            raise InvalidInputError(
                f"step= is a step's name (or 'park', 'continue'), a non-empty str, not "
                f"{self.step!r}"
            )
        if self.position is not None and not _is_position(self.position):
            raise InvalidInputError(
                f"position= is the body's k-th call, an int >= 0 (the first call is 0), or a "
                f"non-empty tuple of them inside a gather, not {shown(self.position)}"
            )
        if self.when not in ("before", "unrecorded", "after"):
            raise InvalidInputError(
                f"when= is 'before', 'unrecorded' or 'after', not {self.when!r}"
            )
        if self.step in ("park", "continue") and self.when == "unrecorded":
            raise InvalidInputError(
                f"step={self.step!r} with when='unrecorded' could never fire: 'unrecorded' "
                "is the moment a step has run and its result is not written yet; use "
                "'before' (or 'after' for 'continue')"
            )
        if self.step in ("park", "continue") and self.position is not None:
            raise InvalidInputError(
                f"step={self.step!r} with position= could never fire: a position names a "
                "step; arm the park or the continuation by step= alone (with "
                "execution_id= to pick the execution)"
            )
        for text, what in ((self.step, "step="), (self.execution_id, "execution_id=")):
            if isinstance(text, str) and text:
                check_text(text, what)  # a name or id no run could have
        if self.step == "park" and self.when == "after":
            raise InvalidInputError(
                "step='park' stops the run before it writes a park and has no 'after'; use "
                "when='before' (the park is durable once the run has parked: no crash "
                "point is needed to stop there)"
            )
        if self.execution_id is not None and (
            not isinstance(self.execution_id, str) or not self.execution_id
        ):
            raise InvalidInputError(
                f"execution_id= is a non-empty str, not {self.execution_id!r}"
            )
        if isinstance(self.times, bool) or not isinstance(self.times, int) or self.times < 1:
            raise InvalidInputError(
                f"times= is how often the point fires, an int >= 1, not {shown(self.times)}"
            )

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
    when: Literal["before", "unrecorded", "after"] = "before",
    execution_id: str | None = None,
    times: int = 1,
) -> CrashAt:
    """Arm a :class:`CrashAt` on ``app``; its arguments are checked as :class:`CrashAt`
    checks them, and ``app`` must be a :class:`Loom`. A refused call arms nothing."""
    if not isinstance(app, Loom):
        raise InvalidInputError(f"crash_at arms a crash point on a Loom app, not {app!r}")
    point = CrashAt(step, position, when, execution_id, times)
    app.crash_points.append(point)
    return point


async def check_replay(app: Loom, execution_ids: Iterable[str] | None = None) -> list[str]:
    """Replay every execution (or those named) against the app's current code, appending
    nothing; raise ReplayDivergedError at the first that no longer matches its log.
    Returns the ids replayed (one named that has no log is skipped).

    A finished execution is replayed to its end. One that has not finished (running, or
    parked) is replayed up to where its log ends: each branch of its body stops at the
    first call the log does not hold (a step is not run, a message is not consumed), and
    the replay matches if every recorded call was made and every wait of its park is
    waited for again, which is what resuming it with this code requires.

    An execution of a workflow the app does not register raises WorkflowNotFoundError
    (a workflow renamed without keeping its old name, or another app's executions in the
    same store: pass the ids of this app's).

    Refused (InvalidInputError) before anything is replayed: an ``app`` that is not a
    :class:`Loom`; ``execution_ids`` that is a str (it would be read as its characters:
    pass ``[execution_id]``) or is not an iterable of non-empty strs.
    """
    if not isinstance(app, Loom):
        raise InvalidInputError(f"check_replay replays on a Loom app, not {app!r}")
    if isinstance(execution_ids, str | bytes):
        raise InvalidInputError(
            f"check_replay(app, execution_ids=...) takes a list of ids, not the "
            f"{type(execution_ids).__name__} {execution_ids!r}; pass [{execution_ids!r}]"
        )
    storage = app.storage
    if execution_ids is None:
        ids: list[str] = []
        after: str | None = None
        while page := await storage.events.list_executions(after=after, limit=100):
            ids.extend(i for i in page if not i.startswith("$"))
            after = page[-1]
    else:
        try:
            ids = list(execution_ids)
        except TypeError:
            raise InvalidInputError(
                f"check_replay(app, execution_ids=...) takes a list of ids, not "
                f"{execution_ids!r}"
            ) from None
        for execution_id in ids:
            if not isinstance(execution_id, str) or not execution_id:
                raise InvalidInputError(
                    f"check_replay(app, execution_ids=...) takes non-empty str ids, not "
                    f"{execution_id!r} (in {ids!r})"
                )
    replayed: list[str] = []
    for execution_id in ids:
        view = await app.inspect(execution_id)
        if view.status is None:
            continue
        try:
            fn = app._body_of(view)
        except WorkflowNotFoundError as exc:
            raise WorkflowNotFoundError(
                exc.name, exc.execution_id, exc.known,
                todo="register it (under its old name too, if it was renamed), or pass "
                "check_replay the ids of this app's executions when the store also holds "
                "another app's",
            ) from None
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
        stderr: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        line_timeout: float = 60.0,
    ) -> ChildProcess:
        """Start ``argv`` with stdin closed, stdout piped and stderr to the file
        ``stderr`` (a path), in ``env`` (default: this process's environment). A line that takes
        longer than ``line_timeout`` seconds raises TimeoutError."""
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise InvalidInputError(
                f"argv must be one or more non-empty strs (the program, then its "
                f"arguments), not {argv!r}"
            )
        if not isinstance(stderr, str | os.PathLike) or not os.fspath(stderr):
            raise InvalidInputError(f"stderr= must be a path (a str or a Path), not {stderr!r}")
        if any("\x00" in a for a in argv) or "\x00" in os.fsdecode(stderr):
            raise InvalidInputError(f"argv and stderr= cannot hold U+0000: {argv!r}, {stderr!r}")
        if env is not None and (
            not isinstance(env, Mapping)
            or not all(
                isinstance(k, str) and k and "=" not in k and "\x00" not in k
                and isinstance(v, str) and "\x00" not in v
                for k, v in env.items()
            )
        ):
            raise InvalidInputError(
                "env= must map variable names (non-empty strs without '=' or U+0000) to "
                f"strs without U+0000, not {env!r}"
            )
        path = Path(stderr)
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
        with path.open("wb") as err:  # noqa: ASYNC230 (a local file, once per child)
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=None if env is None else dict(env),
            )
        return cls(process, path, float(line_timeout))

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
        process exited or was killed). TimeoutError past ``line_timeout``, naming the
        process and the tail of its stderr."""
        stdout = self._process.stdout
        assert stdout is not None
        try:
            raw = await asyncio.wait_for(stdout.readline(), self.line_timeout)
        except TimeoutError:
            raise TimeoutError(
                f"process {self.pid} wrote no line within {self.line_timeout:g} s "
                f"(line_timeout={self.line_timeout:g}); {self._said()}"
            ) from None
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
        (negative: the signal that ended it). A child that has not ended within
        ``line_timeout`` raises TimeoutError and is left running: :meth:`kill` it first."""
        stdout = self._process.stdout
        assert stdout is not None
        try:
            rest = await asyncio.wait_for(stdout.read(), self.line_timeout)
            self.lines.extend(rest.decode(errors="replace").splitlines())
            return await asyncio.wait_for(self._process.wait(), self.line_timeout)
        except TimeoutError:
            raise TimeoutError(
                f"process {self.pid} did not end within {self.line_timeout:g} s "
                f"(line_timeout={self.line_timeout:g}): kill() it first to end it now; "
                f"{self._said()}"
            ) from None

    def _said(self) -> str:
        tail = self.stderr_tail(500)
        return f"its stderr ends: {tail!r}" if tail else "it wrote nothing to stderr"

    def stderr_tail(self, limit: int = 4000) -> str:
        """The last ``limit`` characters of what it wrote to stderr ("" if nothing)."""
        if not self.stderr.exists():
            return ""
        return self.stderr.read_text(errors="replace").strip()[-limit:]
