"""The timer service: fires due TimerStore rows by answering the park they wake.

Each poll asks the store for due rows and decides each one from the execution's log:

- the row is the execution's deadline (``execution_timeout=`` at its start) and the
  execution has not ended: it is cancelled, as ``app.cancel`` does, and marked timed out;
- the execution is gone or finished, or every wait the row was written for is answered:
  the row is obsolete and retired;
- the execution is running (its driver will park again and re-schedule what it still
  waits for, or is being recovered): the row is left, and looked at again after a
  backoff of its own (as a contended one grows), or once this process writes it again;
  rows waiting out that backoff do not count against ``batch``, and each poll goes on
  from the row after the last one the poll before tried, so no number of them hides the
  due rows behind them;
- the execution is parked: it is resumed through the conditional fence
  (``fence_if_parked_at``), answering a waiting message first, else the wait this row was
  written for, else another due wait; when nothing in the park can be answered the row is
  retired, unless it is a sender's wake row whose message is not stored yet (younger than
  ``SENDER_GRACE``, and no stored message names it): that row is left for a later poll.

A contended resume (rivals keep taking the fence) backs off in process, per execution:
exponential full jitter from ``backoff_base`` seconds, capped at ``backoff_cap``, at most
``max_attempts`` tries, then one :class:`RedriveExhaustedError` to ``on_error`` and the
row is retired, with the execution's other due rows (each would wake the same park and
start the tries over); the park stays unanswered for an operator or a recovery. A row whose
execution cannot be read or answered (its payloads shredded, a shard it needs down) backs
off the same way without giving up, reported to ``on_error`` once per run of failures
(the further tries at DEBUG, the wake that ends them at INFO): one such row never holds
up the rows behind it. The memory of
those tries, and of the rows left, is bounded (``capacity`` entries each; the oldest is
forgotten first, and tried again at the next poll). Re-drive
rows (``TimerRecord.redrive``) belong to registered re-drivers; with none registered the
service never asks for them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Literal

from loom_core import InvalidOptionError, LoomError, Redrive, StoreClosedError, TimerRecord
from loom_runtime.clock import LATEST_DEADLINE
from loom_runtime.errors import (
    AppNotRunningError,
    RedriveExhaustedError,
    ResumeContendedError,
    ResumeRefusedError,
    WorkflowNotFoundError,
)

if TYPE_CHECKING:
    from loom_runtime.app import Loom

__all__ = ["Fired", "Redriver", "TimerService"]

_log = logging.getLogger("loom_runtime")

Fired = Literal["resumed", "obsolete", "left", "backing-off", "exhausted", "timed-out"]

Redriver = Callable[[TimerRecord], Awaitable[Literal["done", "noop", "contended"]]]
"""Re-derives a resume for a re-drive row; the first answer other than ``noop`` wins."""

DEFAULT_CAPACITY: Final = 1024

MAX_BACKOFF_SECONDS: Final = 86_400.0
"""The most ``backoff_base`` and ``backoff_cap`` may be: a day. A contended wake retried
a day later is already an operator's matter; the bound also keeps a retry's time short of
the calendar's end (see :data:`~loom_runtime.clock.LATEST_DEADLINE`)."""


_MOST: Final = 2**63 - 1  # what a store takes as a limit (a signed 64-bit integer)


def _count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MOST:
        raise InvalidOptionError(
            f"TimerService({name}=...) must be an int from 1 to 2**63 - 1, not {value!r}"
        )
    return value


def _seconds(name: str, value: object, *, most: float, positive: bool = False) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not 0 <= value <= most  # NaN compares false
        or value == math.inf
        or (positive and value == 0)
    ):
        least = "> 0" if positive else ">= 0"
        upto = "finite" if most == math.inf else f"at most {most:g}"
        raise InvalidOptionError(
            f"TimerService({name}=...) must be a number of seconds {least}, {upto}, "
            f"not {value!r}"
        )
    return float(value)


def _retired(fired: dict[TimerRecord, Fired]) -> int:
    """How many of a poll's rows it retired (answered, obsolete, timed out)."""
    return sum(1 for outcome in fired.values() if outcome in _RETIRING)


_RETIRING: Final = frozenset(("resumed", "obsolete", "timed-out"))


def _order(row: TimerRecord) -> tuple[datetime, str]:
    """Where ``row`` comes in the order ``TimerStore.due`` returns rows in."""
    return (row.wake_at, row.execution_id)


@dataclass(slots=True)
class _Backoff:
    attempt: int
    next_try: datetime
    cause: Literal["contended", "missing", "failing"] = "contended"
    """What the tries met: rivals holding the fence; a workflow this app does not
    register; a failure on the execution itself (the last two reported once a run)."""


class TimerService:
    """Fires due timer rows for one app; see the module docstring."""

    def __init__(
        self,
        app: Loom,
        *,
        poll_interval: float = 0.25,
        batch: int = 100,
        max_attempts: int = 8,
        backoff_base: float = 0.2,
        backoff_cap: float = 30.0,
        capacity: int = DEFAULT_CAPACITY,
        redrivers: Sequence[Redriver] = (),
    ) -> None:
        from loom_runtime.app import Loom  # the app imports this module

        if not isinstance(app, Loom):
            raise InvalidOptionError(f"TimerService() serves a loom_runtime.Loom, not {app!r}")
        self.app = app
        self.poll_interval = _seconds("poll_interval", poll_interval, most=math.inf, positive=True)
        self.batch = _count("batch", batch)
        self.max_attempts = _count("max_attempts", max_attempts)
        self.backoff_base = _seconds("backoff_base", backoff_base, most=MAX_BACKOFF_SECONDS)
        self.backoff_cap = _seconds("backoff_cap", backoff_cap, most=MAX_BACKOFF_SECONDS)
        self.capacity = _count("capacity", capacity)
        if isinstance(redrivers, str | bytes) or not isinstance(redrivers, Sequence) or not all(
            callable(r) for r in redrivers
        ):
            raise InvalidOptionError(
                f"TimerService(redrivers=...) must be a sequence of callables, not {redrivers!r}"
            )
        self.redrivers: list[Redriver] = list(redrivers)
        self._backoff: OrderedDict[str, _Backoff] = OrderedDict()
        # Rows left because their execution was running, by (execution id, wake_at).
        self._left: OrderedDict[tuple[str, datetime], _Backoff] = OrderedDict()
        self.last_fired: dict[TimerRecord, Fired] = {}
        """What the last poll of :meth:`run` did with each row it looked at."""
        # Where the next poll goes on from: the order of the last row a poll tried.
        self._after: tuple[datetime, str] | None = None
        # Polls failed in a row, and the type of error last reported of them.
        self._failed_polls = 0
        self._failing: type[Exception] | None = None

    def app_left(self) -> None:
        """The app was left: a run of failing polls is over, and the next entry's first
        failing poll is reported."""
        self._failed_polls = 0
        self._failing = None

    def register_redriver(self, redriver: Redriver) -> None:
        self.redrivers.append(redriver)

    def forget_left(self, row: TimerRecord) -> None:
        """``row`` was written again (its execution parked on it): look at it when due."""
        if self._left:
            self._left.pop((row.execution_id, row.wake_at), None)

    def next_tries(self) -> list[datetime]:
        """When each contended or unregistered wake is to be tried again."""
        return [backoff.next_try for backoff in self._backoff.values()]

    def backing_off(self) -> dict[str, tuple[int, datetime]]:
        """Executions whose wake is backing off: attempt and next try, for inspection."""
        return {k: (v.attempt, v.next_try) for k, v in self._backoff.items()}

    async def run(self) -> None:
        """Poll until cancelled; a failing poll is reported and the loop goes on.

        On a clock that moves only when told (one with ``tick``: the test kit's virtual
        clock), each poll after the first waits for the clock's next instant instead of
        ``poll_interval``; the first also tells the clock of every row already written
        (``note_wake``), so that it stops when they fall due. Otherwise a poll that
        retired a whole ``batch`` is followed by the next at once."""
        clock = self.app.clock
        tick = getattr(clock, "tick", None)
        note = getattr(clock, "note_wake", None)
        if note is not None:
            try:
                for row in await self._every_row():
                    note(row.wake_at)
            except LoomError as exc:
                # The first failing call of an outage, as a poll's is: reported once.
                self._failed_polls += 1
                self._failing = type(exc)
                self.app.hooks.error(exc)
        while True:
            self.last_fired = await self.poll_reporting()
            if tick is not None:
                await tick(self)
            elif _retired(self.last_fired) >= self.batch:
                # A backlog (thousands of rows due at once): the next batch now, not a
                # poll_interval later, which would cap a node at batch rows a interval.
                # Only rows retired count, so this ends as the backlog does, and rows
                # that keep failing still wait their interval.
                await asyncio.sleep(0)
            else:
                await clock.sleep(self.poll_interval)

    async def _every_row(self) -> tuple[TimerRecord, ...]:
        """Every row the store holds (for a clock that moves only when told: a test's),
        asking for twice as many each time until it has them all."""
        limit = 1000
        while True:
            rows = await self.app.storage.timers.due(LATEST_DEADLINE, limit=limit)
            if len(rows) < limit or limit == _MOST:
                return rows
            limit = min(2 * limit, _MOST)

    async def poll_reporting(self) -> dict[TimerRecord, Fired]:
        """:meth:`poll_once`, with a failure reported to ``on_error`` rather than raised:
        the first of a run of failing polls (a store outage fails every poll, four a
        second by default, for as long as it lasts), and each that fails with another type
        of error; the others are logged at DEBUG, and the poll that answers again after
        them at INFO."""
        try:
            fired = await self.poll_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed_polls += 1
            if type(exc) is not self._failing:
                self._failing = type(exc)
                self.app.hooks.error(exc)
            else:
                _log.debug("a poll of the timer service failed again: %s", exc)
            return {}
        if self._failed_polls:
            _log.info(
                "the timer service's polls answer again, after %d failed in a row",
                self._failed_polls,
            )
            self._failed_polls = 0
            self._failing = None
        return fired

    async def poll_once(self) -> dict[TimerRecord, Fired]:
        """Fire up to ``batch`` due rows once; return what became of each row looked at.

        Rows of an execution that is backing off, and rows left recently (their execution
        was running), are passed over without counting against ``batch``: the store
        returns due rows oldest first, so a batch of them would otherwise hide every due
        row behind it, on every poll, for as long as they stay. Each poll goes on from the
        row after the last one the poll before tried, and round to the oldest from the
        newest: more such rows than the service remembers (``capacity``) are tried in
        turn, a batch a poll, rather than the oldest of them, forgotten and tried again,
        taking every batch and hiding the due rows behind them."""
        if not self.app.running:
            raise AppNotRunningError("app.timer_service.poll_once()")
        now = self.app.clock.now()
        timers = self.app.storage.timers
        fired: dict[TimerRecord, Fired] = {}
        seen: set[TimerRecord] = set()
        exhausted: set[str] = set()
        tried = 0
        after = self._after
        limit = self.batch
        rows: tuple[TimerRecord, ...] = ()
        read_to_end = False
        while True:
            if not read_to_end:
                rows = await timers.due(now, limit=limit, redrive=bool(self.redrivers))
                read_to_end = len(rows) < limit
            for row in rows:
                if row in seen or (after is not None and _order(row) <= after):
                    continue
                if tried >= self.batch:
                    return fired
                seen.add(row)
                if row.redrive is not None:
                    tried += 1
                    self._after = _order(row)
                    await self._redrive(row)
                    continue
                backoff = self._backoff.get(row.execution_id)
                if backoff is not None and self._waiting(backoff, now):
                    fired[row] = "backing-off"
                    continue
                left = self._left.get((row.execution_id, row.wake_at))
                if left is not None and self._waiting(left, now):
                    fired[row] = "left"
                    continue
                if row.execution_id in exhausted:
                    fired[row] = "exhausted"  # retired with the row that gave up
                    continue
                tried += 1
                self._after = _order(row)
                fired[row] = await self.fire(row)
                if fired[row] == "exhausted":
                    exhausted.add(row.execution_id)
            if tried >= self.batch:
                return fired
            if read_to_end:
                if after is None:
                    # Round from the oldest, and every due row looked at: the next poll
                    # starts from the oldest again.
                    self._after = None
                    return fired
                after = None  # past the newest: round to the oldest, in the rows in hand
                continue
            # Every row read is passed over or tried: read past them. The limit doubles,
            # so however many there are, a poll reads each at most about twice.
            limit = min(2 * limit, _MOST)

    def _waiting(self, entry: _Backoff, now: datetime) -> bool:
        """Whether ``entry``'s wait is still to run out at ``now``. A next try further off
        than ``backoff_cap`` (the longest wait drawn) was drawn before the clock stepped
        back (NTP, an operator): the wait has run, or the row would be passed over for as
        long as the step, an hour for an hour, not at most ``backoff_cap`` seconds."""
        return now < entry.next_try <= now + timedelta(seconds=self.backoff_cap)

    async def fire(self, row: TimerRecord) -> Fired:
        timers = self.app.storage.timers
        try:
            outcome = await self.app.wake(row)
        except ResumeContendedError:
            return await self._contended(row)
        except WorkflowNotFoundError as exc:
            return self._retry_later(row, exc, "missing")
        except ResumeRefusedError:
            outcome = "obsolete"
        except (StoreClosedError, AppNotRunningError):
            raise  # nothing will answer again: the poll ends
        except LoomError as exc:
            return self._retry_later(row, exc, "failing")
        key = (row.execution_id, row.wake_at)
        if outcome == "left":
            self._ended(self._backoff.pop(row.execution_id, None), row)
            # Looked at again after a backoff that grows as a contended one does: the row
            # waits for its execution to park (which writes it again, and ends the
            # backoff: see forget_left) or for a recovery.
            entry = self._left.pop(key, None)
            attempt = (entry.attempt if entry is not None else 0) + 1
            self._left[key] = _Backoff(attempt, self.app.clock.now() + self._jitter(attempt))
            while len(self._left) > self.capacity:
                self._left.popitem(last=False)
            return outcome
        try:
            await timers.complete(row.execution_id, row.wake_at)
            if outcome == "obsolete":
                await self.app.retired(row)
        except StoreClosedError:
            raise
        except LoomError as exc:
            # The row stays (a full disk, a store away): tried again after a growing wait,
            # which finds what this wake did and retires it. The poll goes on.
            return self._retry_later(row, exc, "failing")
        self._ended(self._backoff.pop(row.execution_id, None), row)
        self._left.pop(key, None)
        return outcome

    @staticmethod
    def _ended(entry: _Backoff | None, row: TimerRecord) -> None:
        """``row`` woke its execution: the failures of its tries, reported to
        ``on_error`` once, are over."""
        if entry is not None and entry.cause != "contended":
            _log.info(
                "the timer row of %r wakes it again, after %d failed tries",
                row.execution_id, entry.attempt, extra={"execution_id": row.execution_id},
            )

    async def _contended(self, row: TimerRecord) -> Fired:
        now = self.app.clock.now()
        entry = self._backoff.pop(row.execution_id, None)
        attempt = (entry.attempt if entry is not None and entry.cause == "contended" else 0) + 1
        if attempt >= self.max_attempts:
            self.app.hooks.error(RedriveExhaustedError(row.execution_id, attempt))
            timers = self.app.storage.timers
            try:
                # The park's other due rows go too: each would wake the same contended
                # park, starting the tries (and the report) over, at once.
                for other in await timers.pending(row.execution_id):
                    if other != row and other.redrive is None and other.wake_at <= now:
                        await timers.complete(other.execution_id, other.wake_at)
                await timers.complete(row.execution_id, row.wake_at)
            except StoreClosedError:
                raise
            except LoomError as exc:
                return self._retry_later(row, exc, "failing")
            return "exhausted"
        self._backoff[row.execution_id] = _Backoff(attempt, now + self._jitter(attempt))
        while len(self._backoff) > self.capacity:
            self._backoff.popitem(last=False)
        return "backing-off"

    def _retry_later(
        self, row: TimerRecord, exc: LoomError, cause: Literal["missing", "failing"]
    ) -> Fired:
        """The row is left, and tried again after a backoff that grows as a contended one
        does, never giving up; ``on_error`` hears of ``exc`` once per run of such tries.
        ``missing``: this app does not register the workflow, and a node that does may
        wake it (another node's row is not this one's to retire). ``failing``: waking it
        failed on its execution (its log cannot be read, a store call for it failed), a
        cause that may pass (a shard comes back). The poll goes on with the next row."""
        entry = self._backoff.pop(row.execution_id, None)
        if entry is None or entry.cause != cause:
            self.app.hooks.error(exc)
        else:
            _log.debug(
                "the timer row of %r failed again to wake it: %s", row.execution_id, exc,
                extra={"execution_id": row.execution_id},
            )
        attempt = (entry.attempt if entry is not None and entry.cause == cause else 0) + 1
        self._backoff[row.execution_id] = _Backoff(
            attempt, self.app.clock.now() + self._jitter(attempt), cause
        )
        while len(self._backoff) > self.capacity:
            self._backoff.popitem(last=False)
        return "backing-off"

    def _jitter(self, attempt: int) -> timedelta:
        """Full jitter: uniform in [0, min(cap, base * 2**(attempt - 1))) seconds."""
        # The exponent stops at 64, so a large attempt count cannot overflow a float (a
        # base that has not reached the cap after 64 doublings is too small to matter).
        ceiling = min(self.backoff_cap, self.backoff_base * 2.0 ** min(max(attempt - 1, 0), 64))
        return timedelta(seconds=self.app.random.random() * ceiling)

    async def _redrive(self, row: TimerRecord) -> None:
        """Hand a re-drive row to the re-drivers. ``contended`` (or a re-driver that
        raises, whatever it raises, reported to ``on_error``) writes the next row,
        attempt + 1, before this one is retired; the last attempt reports
        RedriveExhaustedError once instead."""
        assert row.redrive is not None
        timers = self.app.storage.timers
        answer: Literal["done", "noop", "contended"] = "noop"
        for redriver in self.redrivers:
            try:
                answer = await redriver(row)
            except Exception as exc:  # a re-driver's own bug too: the poll goes on
                self.app.hooks.error(exc)
                answer = "contended"
            if answer != "noop":
                break
        if answer == "contended":
            attempt = row.redrive.attempt + 1
            if attempt >= self.max_attempts:
                self.app.hooks.error(RedriveExhaustedError(row.execution_id, attempt))
            else:
                # Strictly after the fired row, so a zero draw cannot rewrite the same key.
                wake_at = max(
                    self.app.clock.now() + self._jitter(attempt),
                    row.wake_at + timedelta(microseconds=1),
                )
                await self.app.schedule_wake(
                    TimerRecord(row.execution_id, wake_at, Redrive(attempt))
                )
        await timers.complete(row.execution_id, row.wake_at)
