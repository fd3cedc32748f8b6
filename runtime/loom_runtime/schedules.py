"""Scheduled workflows: a workflow started at each instant of a cron expression or of a
fixed interval, once per instant however many nodes serve the schedule.

Every node that serves timers keeps, in memory, the next instant of each schedule its app
registers, and at that instant starts the workflow with the instant as its one argument,
under an id made of the schedule's name and the instant (``report@2030-01-01T09:00:00Z``)
with ``if_exists="attach"``: the first node to start it creates the execution, and the
others find it there. Nothing about a schedule is stored: the instants are a function of
the expression and the clock, so a node that starts, or one whose code changed the
expression, simply computes them again. Instants that pass while no node serves the
schedule are not made up for (see docs/design.md, "Schedules keep no state").
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from cronsim import CronSim, CronSimError

from loom_core import (
    ExecutionAlreadyExistsError,
    InvalidExecutionIdError,
    InvalidOptionError,
    LoomError,
    StoreClosedError,
)
from loom_runtime.clock import LATEST_DEADLINE, MAX_DURATION, shown
from loom_runtime.errors import AppNotRunningError

if TYPE_CHECKING:
    from loom_runtime.app import Loom

__all__ = ["Schedule", "Scheduler", "tick_id"]

_log = logging.getLogger("loom_runtime")

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_RETRY_FIRST: Final = 1.0
_RETRY_CAP: Final = 30.0
_WALL_SLICE: Final = 60.0
"""The longest sleep a scheduler takes on a clock that moves by itself: it reads the clock
again after each, so a jump of the wall clock (a suspended host, a stepped clock, whose
sleep runs on a monotonic clock that did not move) delays an instant by at most this."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """When ``workflow`` is started: at each instant of ``cron`` (a five-field cron
    expression, in UTC), or every ``every`` seconds counted from the Unix epoch (so every
    node computes the same instants)."""

    name: str
    workflow: str
    cron: str | None = None
    every: float | None = None

    def next_after(self, moment: datetime) -> datetime | None:
        """The first instant of the schedule strictly after ``moment``; None past
        LATEST_DEADLINE."""
        if self.cron is not None:
            try:
                upcoming: datetime = next(CronSim(self.cron, moment.astimezone(UTC)))
            except (StopIteration, OverflowError, ValueError):
                return None  # none left before the calendar ends
            return upcoming if upcoming <= LATEST_DEADLINE else None
        assert self.every is not None
        period = timedelta(seconds=self.every)
        elapsed = moment - _EPOCH
        try:
            instant = _EPOCH + (elapsed // period + 1) * period
        except OverflowError:
            return None  # past the calendar's end
        return instant if instant <= LATEST_DEADLINE else None


def tick_id(name: str, instant: datetime) -> str:
    """The id of the execution a schedule starts at ``instant``."""
    return f"{name}@{instant.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S')}Z"


def check_schedule(name: str, workflow: str, cron: object, every: object) -> Schedule:
    """A schedule's spec, checked (InvalidOptionError naming what is wrong)."""
    if (cron is None) == (every is None):
        raise InvalidOptionError(
            f"schedule {name!r} needs exactly one of cron= (a cron expression such as "
            "'0 9 * * MON-FRI') and every= (seconds or a timedelta)"
        )
    if cron is not None:
        if not isinstance(cron, str):
            raise InvalidOptionError(
                f"schedule {name!r}: cron= takes a cron expression as a str, not {cron!r}"
            )
        if len(cron.split()) != 5:
            raise InvalidOptionError(
                f"schedule {name!r}: {cron!r} is not a cron expression of five fields "
                "(minute hour day-of-month month day-of-week, in UTC)"
            )
        try:
            CronSim(cron, _EPOCH)
        except (CronSimError, ValueError) as exc:
            raise InvalidOptionError(
                f"schedule {name!r}: {cron!r} is not a cron expression cronsim reads ({exc}); "
                "five fields: minute hour day-of-month month day-of-week, in UTC"
            ) from None
        return Schedule(name, workflow, cron=cron)
    seconds: object
    if isinstance(every, timedelta):
        seconds = every.total_seconds()
    elif isinstance(every, int | float) and not isinstance(every, bool):
        seconds = every
    else:
        raise InvalidOptionError(
            f"schedule {name!r}: every= takes seconds (int or float) or a timedelta, not "
            f"{every!r}"
        )
    assert isinstance(seconds, int | float)
    if not 1 <= seconds <= MAX_DURATION.total_seconds():  # NaN compares false
        raise InvalidOptionError(
            f"schedule {name!r}: every= must be from 1 second to 1000 years, not "
            f"{shown(every)}"
        )
    return Schedule(name, workflow, every=float(seconds))


@dataclass(slots=True)
class _Failing:
    """What a schedule's starts met since one last succeeded: the type of error last
    reported to ``on_error``, and how many instants were given up."""

    reported: type[Exception] | None = None
    given_up: int = 0

    def report(self, app: Loom, exc: Exception, name: str, argument: str) -> None:
        """``exc`` met a start: to ``on_error`` when it is the first of a run of failures
        or of another type than the last reported, else to DEBUG."""
        if type(exc) is not self.reported:
            self.reported = type(exc)
            app.hooks.error(exc)
        else:
            _log.debug("schedule %r failed again to start %s: %s", name, argument, exc)

    def ended(self, name: str) -> None:
        """An instant started: an outage the schedule met is over."""
        if self.given_up:
            _log.info(
                "schedule %r starts its instants again; it gave up %d while the store "
                "failed", name, self.given_up,
            )
        elif self.reported is not None:
            _log.info("schedule %r starts its instants again", name)
        self.reported = None
        self.given_up = 0


class Scheduler:
    """Starts the app's scheduled workflows at their instants (see the module docstring):
    one task per schedule while the app runs and serves timers."""

    def __init__(self, app: Loom) -> None:
        self.app = app
        self.schedules: dict[str, Schedule] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Tasks making progress (not asleep on the app's clock): what a virtual clock
        # waits for before it moves on.
        self._working: set[asyncio.Task[None]] = set()

    def add(self, schedule: Schedule) -> None:
        """Serve ``schedule`` (the app checked that no other schedule has its name). The
        same schedule added again while its task runs keeps that task: a new one would
        cancel an instant's start in flight and compute its first instant after now,
        past the one cancelled, which would then never be started."""
        running = self._tasks.get(schedule.name)
        if running is not None and not running.done() and self.schedules[schedule.name] == schedule:
            return
        self.schedules[schedule.name] = schedule
        if self.app.serves_timers:
            self._spawn(schedule)

    def start(self) -> None:
        """Start a task for each schedule (the app has just been entered)."""
        for schedule in self.schedules.values():
            self._spawn(schedule)

    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks.values())

    def stopped(self) -> None:
        """The app has left and stopped the tasks."""
        self._tasks.clear()
        self._working.clear()

    def busy(self) -> list[asyncio.Task[None]]:
        return [task for task in self._working if not task.done()]

    def _spawn(self, schedule: Schedule) -> None:
        old = self._tasks.pop(schedule.name, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(self._serve(schedule), name=f"loom:schedule:{schedule.name}")
        self._tasks[schedule.name] = task
        self._working.add(task)
        task.add_done_callback(self._working.discard)

    async def _serve(self, schedule: Schedule) -> None:
        """Serve ``schedule`` until the app leaves. A failure none of the steps below
        expects (a bug: ours, a clock's) ends the task: it goes to ``on_error`` and an
        ERROR line says the schedule is no longer served, rather than the task dying
        unheard and the schedule stopping without a word."""
        try:
            await self._serve_instants(schedule)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.app.hooks.error(exc)
            _log.error(
                "schedule %r is no longer served in this process: %s: %s; it is served "
                "again when the app is entered again",
                schedule.name, type(exc).__name__, exc,
            )

    async def _serve_instants(self, schedule: Schedule) -> None:
        if not await self._fits(schedule):
            return
        clock = self.app.clock
        instant = schedule.next_after(clock.now())
        failing = _Failing()
        while instant is not None:
            await self._until(instant)
            if not await self._start_at(schedule, instant, failing):
                return
            # The instants that passed while this one was being started are not made up
            # for: the next is the first after now.
            instant = schedule.next_after(max(instant, clock.now()))

    async def _fits(self, schedule: Schedule) -> bool:
        """Whether the store takes the ids the schedule's instants make. A decorator may
        leave ids less room than the kernel's limit the decorator checked (the tenant
        decorator's prefix): a name too long for this store is reported to ``on_error``
        once, and the schedule not served, rather than failing at every instant. False
        too when the app's store was closed."""
        app = self.app
        delay = _RETRY_FIRST
        while True:
            try:
                await app.check_id_room(tick_id(schedule.name, LATEST_DEADLINE))
                return True
            except InvalidExecutionIdError as exc:
                app.hooks.error(
                    InvalidOptionError(
                        f"schedule {schedule.name!r} is not served: this store refuses the "
                        f"ids its instants make ({exc}); give it a shorter name="
                    )
                )
                return False
            except StoreClosedError:
                return False
            except Exception as exc:
                # The store's trouble (or a decorator's bug), not the name's: asked again,
                # after 1 s and then twice as long each time up to 30 s, the first failure
                # reported.
                if delay == _RETRY_FIRST:
                    app.hooks.error(exc)
                await self._until(app.clock.now() + timedelta(seconds=delay))
                delay = min(delay * 2, _RETRY_CAP)

    async def _until(self, instant: datetime) -> None:
        """Sleep on the app's clock until ``instant``, counted as not working meanwhile:
        in slices of at most a minute on a clock that moves by itself, in one on a clock
        that moves only when told (one with ``tick``, the test kit's virtual clock)."""
        task = asyncio.current_task()
        assert task is not None
        clock = self.app.clock
        most = _WALL_SLICE if getattr(clock, "tick", None) is None else math.inf
        while (delay := (instant - clock.now()).total_seconds()) > 0:
            self._working.discard(task)
            try:
                await clock.sleep(min(delay, most))
            finally:
                self._working.add(task)

    async def _undrained(self) -> None:
        """Wait until no drain waits, counted as not working meanwhile: a drain may wait
        for a run that waits for a clock that moves only when told (a retry's interval on
        the test kit's virtual clock), and that clock moves on only once this task is
        quiet."""
        app = self.app
        if not app.draining:
            return
        task = asyncio.current_task()
        assert task is not None
        self._working.discard(task)
        settled = getattr(app.clock, "note_settled", None)
        if settled is not None:
            settled()  # an advance waiting for this task looks again
        try:
            await app.undrained()
        finally:
            self._working.add(task)

    async def _start_at(self, schedule: Schedule, instant: datetime, failing: _Failing) -> bool:
        """Start the schedule's workflow for ``instant`` (or find it started by another
        node); False when the app is leaving. A failing store is tried again, after 1 s
        and then twice as long each time up to 30 s, until the schedule's next instant,
        when this one is given up. An outage is reported once however many instants it
        spans (``failing``), and logged again once an instant starts."""
        app = self.app
        execution_id = tick_id(schedule.name, instant)
        argument = instant.astimezone(UTC).isoformat()
        following = schedule.next_after(instant)
        delay = _RETRY_FIRST
        while True:
            await self._undrained()  # no new work while a drain waits for the work there is
            try:
                await app.start(schedule.workflow, argument, id=execution_id, if_exists="attach")
                failing.ended(schedule.name)
                return True
            except AppNotRunningError:
                return False  # the app is leaving
            except StoreClosedError:
                if app.running:
                    _log.warning(
                        "schedule %r stops: the app's store was closed under it", schedule.name
                    )
                return False
            except ExecutionAlreadyExistsError as exc:
                # Another workflow at the id (attach refused it): nothing to retry.
                app.hooks.error(exc)
                return True
            except LoomError as exc:
                failing.report(app, exc, schedule.name, argument)
                retry_at = app.clock.now() + timedelta(seconds=delay)
                if following is not None and retry_at >= following:
                    failing.given_up += 1
                    if failing.given_up == 1:
                        _log.warning(
                            "schedule %r gave up its instant %s: the store kept failing "
                            "(%s); the instants given up until one starts are counted "
                            "when it does",
                            schedule.name, argument, exc,
                        )
                    else:
                        _log.debug("schedule %r gave up its instant %s too",
                                   schedule.name, argument)
                    return True
                await self._until(retry_at)
                delay = min(delay * 2, _RETRY_CAP)
            except Exception as exc:  # not the runtime's: a hook's, a decorator's bug
                # Reported as a failing store is: a bug met at every instant of an
                # every-second schedule is one report, not one a second.
                failing.report(app, exc, schedule.name, argument)
                return True  # the next instant is tried as usual
