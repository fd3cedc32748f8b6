"""One run of a workflow body under a fence token: :class:`Run`.

A run replays the body from the top against a :class:`~loom_runtime.fold.View` of the log,
serves every recorded call from it, makes the new calls live and appends their records
under the token it holds, and ends in exactly one of: a terminal event, a park (every
branch of the body waits), or a stop (fenced out, diverged, a storage failure, a simulated
crash) that appends nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, cast

from loom_core import (
    Event,
    InvalidInputError,
    InvalidOptionError,
    JsonValue,
    LoomError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    TimerRecord,
    WriteOutcomeUnknownError,
    is_answering,
)
from loom_core.spi import MAX_EVENTS_PER_APPEND
from loom_runtime import records
from loom_runtime.clock import LATEST_DEADLINE
from loom_runtime.context import BRANCH, Branch, Context, ContinueAsNew, Durable, InStep
from loom_runtime.errors import (
    DurableCallCancelledError,
    NotJsonError,
    ReplayDivergedError,
    RunStoppedError,
    StepFailedError,
)
from loom_runtime.fold import Recorded, View, advance, describe_any
from loom_runtime.inbox import Cursor
from loom_runtime.records import (
    Position,
    Received,
    Wait,
    fresh,
    json_arguments,
    json_value,
    position_text,
)
from loom_runtime.retry import NO_RETRY, Retry

if TYPE_CHECKING:
    from loom_runtime.app import Loom

__all__ = ["FencedOut", "Outcome", "Run", "SimulatedCrash", "TimedOut", "type_name"]

_CO_COROUTINE: Final = inspect.CO_COROUTINE
_log = logging.getLogger("loom_runtime")


class _Stop(BaseException):
    """Unwinds every branch of a run that must append nothing more. A BaseException so an
    ``except Exception`` in the body cannot swallow it."""


class _Park(BaseException):
    """Unwinds every branch of a run whose branches all wait: the run parks."""


@dataclass(frozen=True, slots=True)
class _Raised:
    """The body left by raising ``exception``."""

    exception: BaseException


class FencedOut(LoomError):
    """Another driver holds the execution now (a newer token, or an answer we did not
    write): this run stops quietly."""

    def __init__(self, execution_id: str, detail: str) -> None:
        self.execution_id = execution_id
        super().__init__(f"run of {execution_id!r} was fenced out: {detail}")


class TimedOut(LoomError):
    """The execution's deadline passed while this run drove it: the run stops without
    another write, and the app cancels the execution as timed out."""

    def __init__(self, execution_id: str, deadline: datetime) -> None:
        self.execution_id = execution_id
        super().__init__(f"execution {execution_id!r} passed its deadline {deadline.isoformat()}")


class SimulatedCrash(LoomError):
    """A crash the test kit injected: the run vanishes as a killed process would."""


@dataclass(slots=True)
class Outcome:
    """How a run ended."""

    kind: Literal["completed", "failed", "suspended", "continued", "stopped"]
    park_seq: int = -1
    successor: Successor | None = None
    reason: BaseException | None = None
    tried: bool = False
    """A park the run already tried to answer itself (nothing more to try after it)."""


Workflow = Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Successor:
    """The execution a continue-as-new created, ready to be driven under ``token``."""

    execution_id: str
    token: int
    view: View


class Run:
    """Drives one execution's body once; see the module docstring."""

    __slots__ = (
        "_active",
        "_beyond",
        "_blocked",
        "_consumed",
        "_cursor",
        "_cut",
        "_cut_by_cancel",
        "_deadline",
        "_fn",
        "_frontier",
        "_furthest",
        "_gathered",
        "_head",
        "_held",
        "_lock",
        "_parked_at",
        "_pending",
        "_quiet",
        "_replay_only",
        "_retried",
        "_seen",
        "_stop_reason",
        "_stopped",
        "_tasks",
        "_unpatched",
        "_view",
        "_visited",
        "_waits",
        "app",
        "execution_id",
        "scheduled",
        "token",
        "workflow",
    )

    def __init__(
        self,
        app: Loom,
        view: View,
        token: int,
        fn: Workflow,
        *,
        replay_only: bool = False,
    ) -> None:
        self.app = app
        self.execution_id = view.execution_id
        self.workflow = view.workflow
        self.token = token
        self.scheduled = False
        """Whether this run wrote timer rows (for a park its write of may then fail)."""
        self._fn = fn
        self._replay_only = replay_only
        # A cancellation cuts the body wherever it is: the replay of a cancelled log ends,
        # matched, at the first call the log does not hold, and any ending of the body
        # matches once every recorded call was made.
        self._cut_by_cancel = replay_only and view.status == "cancelled"
        # The replay of an execution that has not finished runs up to where its log ends
        # (its frontier): a call the log does not hold holds its branch there, as a live
        # run would go on from it, and the replay ends, matched, once every branch is
        # held, waits or has ended (see _frontier_reached).
        self._frontier = replay_only and not view.terminal
        # A live run stops at its deadline (a replay of the log only does not).
        self._deadline = None if replay_only else view.deadline
        # The positions of failed attempts in the log whose step the body has made again.
        self._retried: set[Position] = set()
        # Patches this run's body found absent (the execution recorded that stretch with
        # the old code): a later check of the same name says so too, rather than take
        # the new path halfway through.
        self._unpatched: set[str] = set()
        self._start_from(view, set())
        self._stopped = False
        # Futures of the gathers and waits that block until the run is quiet or stops.
        self._blocked: set[asyncio.Future[None]] = set()
        self._stop_reason: BaseException | None = None
        self._lock: asyncio.Lock | None = None  # made by the first gather
        self._pending: list[NewEvent] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seen: list[Event] = []
        self._parked_at = -1  # the park this run wrote and could not go on from, if any
        # Branches waiting out a retry's interval on the app's clock (see settled).
        self._held = 0
        # The position of a durable call the body's own code cancelled (see cut).
        self._cut: Position | None = None

    def _start_from(self, view: View, visited: set[Position]) -> None:
        """Take ``view`` as the log this run goes on from: a new run's, or the view past
        an answer the run made to its own park (``visited``: the recorded calls already
        made)."""
        self._view = view
        self._head = view.head
        self._consumed = set(view.consumed)
        self._cursor = Cursor()  # for this set of consumed messages, which only grows
        self._visited = visited
        self._gathered: frozenset[Position] | None = None
        self._furthest: dict[Position, int] | None = None
        self._waits: dict[Position, Wait] = {}
        # Branches making progress: the body, or the branches of the gathers it is in.
        # When none is left and some wait, the run is quiet: it parks.
        self._active = 1
        self._beyond = 0  # branches held where the log ends (a replay to the frontier)
        self._quiet = False

    # -- the run ---------------------------------------------------------------------------

    async def drive(self) -> Outcome:
        """Run the body to its end, its park, or its stop.

        The body runs in the caller's task (a task of its own per run cost a short
        workflow more than its steps did); a park or a stop unwinds it with a
        BaseException that ``except Exception`` in the body cannot swallow.
        """
        ctx = Context(self)
        reset = BRANCH.set(Branch((), 0, asyncio.current_task(), self))
        try:
            result = await self._fn(ctx, *fresh(self._view.input))  # type: ignore[misc]
        except asyncio.CancelledError as exc:
            if _being_cancelled():
                await self._teardown()
                raise
            # The body's own (a future it awaited was cancelled): it fails, as any error.
            return await self._ended(_Raised(exc))
        except BaseException as exc:  # sorted in _ended: a park, a stop, or an end
            return await self._ended(_Raised(exc))
        finally:
            BRANCH.reset(reset)
        return await self._ended(result)

    async def _ended(self, ending: object) -> Outcome:
        """Act on how the body left: the run's flags first (a body that swallowed the
        unwinding of a park or a stop still parks or stops), then what it returned or
        raised."""
        await self._teardown()
        if self._stopped:
            return self._outcome("stopped", reason=self._stop_reason)
        if self._quiet:
            if self._frontier:
                return self._frontier_reached()
            if self._parked_at >= 0:  # written by the wait that tried to go on from it
                return self._outcome("suspended", park_seq=self._parked_at, tried=True)
            return await self._park()
        try:
            return await self._finish(ending)
        except _Stop:
            return self._outcome("stopped", reason=self._stop_reason)

    async def _teardown(self) -> None:
        tasks = list(self._tasks)
        if not tasks:
            return
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _outcome(
        self,
        kind: Literal["completed", "failed", "suspended", "continued", "stopped"],
        **extra: Any,
    ) -> Outcome:
        return Outcome(kind, **extra)

    @property
    def waited(self) -> bool:
        """Whether an earlier park of the execution waited on something (its timer rows
        may be left to cancel)."""
        return bool(self._view.waits)

    @property
    def deadline(self) -> datetime | None:
        """The execution's deadline, if it has one (its timer row is left to cancel)."""
        return self._view.deadline

    @property
    def last_written(self) -> Event | None:
        """The last event this run wrote or stepped over (after a terminal outcome: the
        terminal event)."""
        return self._seen[-1] if self._seen else None

    def final_view(self) -> View:
        """The view the run started from, advanced by everything it wrote or read past.
        Call it once, after :meth:`drive`: the run's own view is advanced, not copied."""
        return advance(self._view, self._seen)

    async def _finish(self, ending: object) -> Outcome:
        exc = ending.exception if isinstance(ending, _Raised) else None
        if isinstance(exc, _Stop | _Park):
            return self._outcome("stopped", reason=self._stop_reason)
        self._check_cut(exc)  # however the body ended, it went on past a call it cancelled
        if isinstance(exc, ContinueAsNew):
            self._check_all_visited("no call: the body continues as new")
            if self._replay_only:
                self._expect_terminal("continued")
                return self._outcome("continued")
            try:
                args = json_arguments(exc.args_, f"the input of {self.workflow!r}'s successor")
            except InvalidInputError as refused:
                await self._append([records.failed(type_name(refused), str(refused))])
                return self._outcome("failed")
            await self._flush()  # the successor's input is made of durable results
            successor = await self.app.create_successor(self._view, args)
            crashable = bool(self.app.crash_points)
            try:
                if crashable and self.app.crash_point(self, (), "continue", "before"):
                    self._halt(SimulatedCrash("simulated crash before the continuation"))
                await self._append([records.continued(successor.execution_id, args)])
                if crashable and self.app.crash_point(self, (), "continue", "after"):
                    self._halt(SimulatedCrash("simulated crash after the continuation"))
            except BaseException:
                self.app.release_successor(
                    successor.execution_id, look=isinstance(self._stop_reason, FencedOut)
                )
                raise
            return self._outcome("continued", successor=successor)
        if exc is not None:
            if not isinstance(exc, Exception | asyncio.CancelledError):
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise exc  # the process is ending: the run stops with it
                # Not a failure of the workflow's (an Exception is one): the run stops
                # as a crash would, loudly, leaving the execution for a recovery.
                stopped = RunStoppedError(self.execution_id, exc)
                stopped.__cause__ = exc
                self._halt(stopped)
            self._check_all_visited(f"no call: the body raises {type(exc).__name__}")
            if self._replay_only:
                self._expect_terminal("failed")
                return self._outcome("failed")
            await self._append([records.failed(type_name(exc), _message(exc))])
            return self._outcome("failed")
        self._check_all_visited("no call: the body returns")
        try:
            result = json_value(ending, f"the result of workflow {self.workflow!r}")
        except InvalidInputError as refused:
            if self._replay_only:
                self._expect_terminal("failed")
                return self._outcome("failed")
            await self._append([records.failed(type_name(refused), str(refused))])
            return self._outcome("failed")
        if self._replay_only:
            self._expect_terminal("completed")
            return self._outcome("completed")
        await self._append([records.completed(result)])
        return self._outcome("completed")

    def _expect_terminal(self, kind: str) -> None:
        if self._frontier:
            # The log has not ended: a live run would end here, as the body did, unless
            # the park it answers waits for a call the body no longer makes.
            self._check_waits_reached(f"no call: the body ends {kind}")
            return
        if self._view.status != kind and not self._cut_by_cancel:
            self._diverge(
                (len(self._view.records),),
                f"an execution that ended {self._view.status}",
                f"no call: the body ends {kind}",
            )

    async def _park(self) -> Outcome:
        if self._replay_only:
            first = min(self._waits)
            self._diverge(first, None, f"a wait at {self._waits[first].site}")
        try:
            self._check_all_visited("no call: the body parks")
        except _Stop:
            return self._outcome("stopped", reason=self._stop_reason)
        waits = sorted(self._waits.values(), key=lambda w: w.position)
        try:
            if self.app.crash_points and self.app.crash_point(self, (), "park", "before"):
                self._halt(SimulatedCrash("simulated crash before the park"))
            wakes = {w.wake_at for w in waits if w.wake_at is not None}
            if self._view.deadline is not None:
                wakes.add(self._view.deadline)  # written again: see Loom._schedule_deadline
            for wake_at in sorted(wakes):
                self.scheduled = True
                try:
                    await self.app.schedule_wake(TimerRecord(self.execution_id, wake_at))
                except LoomError as exc:
                    self.app.hooks.storage_error(self.execution_id, exc)
                    self._halt(exc)
            written = await self._append([records.suspended(waits)])
        except _Stop:
            return self._outcome("stopped", reason=self._stop_reason)
        return self._outcome("suspended", park_seq=written[-1].sequence)

    # -- what Context calls ----------------------------------------------------------------

    def is_replaying(self, branch: Branch | None = None) -> bool:
        """Whether the log holds a call made after the point ``branch`` has reached, in
        it or in a line it is nested in (a gather's branch: the body past the gather):
        the code there ran before, in an earlier run. Without ``branch``, whether any
        recorded call has not been made again yet."""
        if self._replay_only:
            return True
        if branch is None:
            return len(self._visited) < len(self._view.records)
        furthest = self._furthest
        if furthest is None:
            furthest = self._furthest = _furthest(self._view)
        prefix = branch.prefix
        if furthest.get(prefix, -1) >= branch.counter:
            return True
        # A branch's prefix is its gather's position then its index, nested as gathers
        # nest: each enclosing line is past the gather once it holds a later call.
        if any(
            furthest.get(prefix[:depth], -1) > prefix[depth]
            for depth in range(len(prefix) - 2, -1, -2)
        ):
            return True
        # Nothing logged after this point: a branch that ended before the run parked (a
        # run parks only once every branch waits or has ended) ran it then, if the call
        # it last made, or the last call before its gather, was answered before the park.
        last = self._view.parked_last
        if not last:
            return False
        position: Position = (*prefix, branch.counter - 1)
        while position[-1] < 0 and len(position) > 1:
            position = (*position[:-3], position[-3] - 1)
        if position[-1] < 0:
            return True  # the body's first line: parked since
        recorded = self._view.records.get(position)
        return recorded is not None and recorded.sequence < last

    @property
    def _about(self) -> dict[str, str]:
        """What a log record of the runtime's about this run carries, as ``ctx.logger``'s
        do: a handler shows or filters by them."""
        return {"execution_id": self.execution_id, "workflow": self.workflow}

    @property
    def settled(self) -> bool:
        """Whether every branch making progress waits out a retry's interval on the app's
        clock: the run goes on only when that clock moves (the test kit's virtual clock
        asks, to know when what it woke has done all it can)."""
        return 0 < self._active <= self._held

    def clock_now(self) -> str:
        return self.app.clock.now().astimezone(UTC).isoformat()

    def draw_random(self) -> float:
        value = self.app.random.random()
        if type(value) is not float or not 0.0 <= value < 1.0:  # NaN compares false
            self._halt(
                InvalidOptionError(
                    f"Loom(random=...)'s random() gave {value!r}, not a float in [0, 1): "
                    "give the app a random.Random, or a source that draws as it does"
                )
            )
        return value

    def draw_uuid(self) -> str:
        bits = self.app.random.getrandbits(128)
        if type(bits) is not int or not 0 <= bits < 1 << 128:
            self._halt(
                InvalidOptionError(
                    f"Loom(random=...)'s getrandbits(128) gave {bits!r}, not an int of 128 "
                    "bits: give the app a random.Random, or a source that draws as it does"
                )
            )
        return str(uuid.UUID(int=bits, version=4))

    async def step(
        self,
        position: Position,
        name: str,
        fn: Callable[..., Any],
        args: tuple[object, ...],
        retry: Retry | None,
        site: str,
        limit: float | None = None,
    ) -> Any:
        view = self._view
        if view.records or view.waits or self._replay_only or view.retries:
            recorded = self._recorded(position, "step", name, site)
            if recorded is not None:
                if recorded.error is not None:
                    raise StepFailedError(
                        name, position_text(position), recorded.attempt, *recorded.error
                    )
                return fresh(recorded.value)
            if view.retries and position in view.retries:
                self._retried.add(position)  # reached again (a frontier's replay holds here)
            self._go_live(position, "step", name, site)
            if self._frontier:
                await self._hold()
        else:
            self._check_alive()  # a new run's call: nothing to match, only the run to be alive
        # What the body drew or recorded before this step (a uuid it passes in, an
        # earlier step's result) is durable before the step's side effects happen.
        await self._flush()
        policy = retry or NO_RETRY
        attempt = 0
        if view.retries and (retrying := view.retries.get(position)) is not None:
            attempt = await self._go_on_retrying(position, name, retrying, policy, site)
        while True:
            attempt += 1
            if self.app.crash_points and self.app.crash_point(self, position, name, "before"):
                self._halt(SimulatedCrash(f"simulated crash before step {name!r}"))
            failure: BaseException | None = None
            in_step = InStep(self.execution_id, position, name, attempt)
            try:
                if limit is None:
                    value = await self._call(fn, args, in_step)
                else:
                    value = await self._call_within(fn, args, in_step, limit)
            except _StepStopped as exc:
                failure = exc.raised
            except Exception as exc:
                failure = exc
            except asyncio.CancelledError as exc:
                if _being_cancelled():
                    raise
                failure = exc  # the step's own (a future it awaited was cancelled)
            if self.app.crash_points and self.app.crash_point(self, position, name, "unrecorded"):
                self._halt(SimulatedCrash(f"simulated crash after step {name!r} ran, unrecorded"))
            if failure is not None:
                self._check_alive()
                if attempt < policy.attempts and policy.retries(failure):
                    delay = policy.delay(attempt)
                    now = self.app.clock.now()
                    retry_at = _later_by(now, delay)
                    # Durable before the wait: a run that dies now goes on from the next
                    # attempt, at the same instant, wherever it is recovered.
                    await self._append([records.attempt_failed(
                        position, name, type_name(failure), _message(failure), attempt,
                        retry_at, site,
                    )])
                    _log.info(
                        "step %r of execution %r failed (attempt %d); trying again in %g s",
                        name, self.execution_id, attempt, delay, exc_info=failure,
                        extra=self._about,
                    )
                    await self._wait_to_retry((retry_at - now).total_seconds())
                    continue
                await self._step_failed(position, name, failure, attempt, site)
            self._check_alive()
            try:
                result = json_value(value, f"the result of step {name!r}")
            except NotJsonError as exc:
                failure = exc
            if failure is not None:
                # Recorded as the step's failure, not retried: the step ran, and running it
                # again would repeat its effects for the same refusal. A replay serves the
                # failure without running the step again. (Raised outside the except, so
                # that no __context__ tells a live run from a replay.)
                await self._step_failed(position, name, failure, attempt, site)
            # Recorded with the run's next write: before the next step runs, or with the
            # park or the end, whichever comes first (see docs/runtime.md, "When a result
            # is durable"). The body's code up to there is replayed, not re-done.
            self._pending.append(
                records.step_completed(position, "step", name, result, attempt, site)
            )
            if self.app.crash_points:
                # Armed crash points (a test's) see each result written as the step returns,
                # so "after" has a moment to stop at: after the record is durable.
                await self._flush()
                if self.app.crash_point(self, position, name, "after"):
                    self._halt(SimulatedCrash(f"simulated crash after step {name!r}"))
            return fresh(result)

    async def _go_on_retrying(
        self, position: Position, name: str, retrying: Recorded, policy: Retry, site: str
    ) -> int:
        """Go on from a step's failed attempt the log holds: wait until the instant its
        retry was due (at once if it has passed), and return the attempts made so far.
        A policy that now allows no more records that failure as the step's last. (A
        step of another name at the position has diverged already: see _go_live.)"""
        assert retrying.error is not None
        assert retrying.retry_at is not None
        if retrying.attempt >= policy.attempts:
            await self._step_failed(position, name, retrying.error, retrying.attempt, site)
        seconds = (retrying.retry_at - self.app.clock.now()).total_seconds()
        if seconds > 0:
            await self._wait_to_retry(seconds)
        return retrying.attempt

    async def _wait_to_retry(self, seconds: float) -> None:
        """Wait out a retry's interval (the branch counts as held meanwhile), then make
        sure the run may still make the attempt."""
        self._held += 1
        try:
            await self._pause(seconds)
        finally:
            self._held -= 1
        # Cancelled, or taken over, meanwhile (here, or by another process): another
        # attempt would repeat the step's effects for a result no write would take.
        self._check_alive()
        await self._skip_unfenced_tail()
        # What other branches recorded meanwhile is durable before the attempt's effects
        # happen, as before any step's (see docs/runtime.md, "When a result is durable").
        await self._flush()

    async def _pause(self, seconds: float) -> None:
        """Wait out a retry's interval on the app's clock, or until the run stops."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        sleeper = loop.create_task(self.app.clock.sleep(seconds))

        def wake(_: object) -> None:
            if not woken.done():
                woken.set_result(None)

        sleeper.add_done_callback(wake)
        self._blocked.add(woken)
        try:
            await woken
        finally:
            self._blocked.discard(woken)
            sleeper.cancel()
        if sleeper.done() and not sleeper.cancelled():
            sleeper.result()  # raises what the clock's sleep raised

    async def _step_failed(
        self,
        position: Position,
        name: str,
        failure: BaseException | tuple[str, str],
        attempt: int,
        site: str,
    ) -> NoReturn:
        """Record the step's failure and raise it into the body as a replay will: a
        StepFailedError naming the error's type and message, with no ``__cause__`` (a
        replay has no exception object to chain; the live one is logged here). A
        ``(type, message)`` pair is a failed attempt the log already holds."""
        if isinstance(failure, tuple):
            error_type, message = failure
        else:
            error_type, message = type_name(failure), _message(failure)
        await self._append(
            [records.step_failed(position, name, error_type, message, attempt, site)]
        )
        _log.warning(
            "step %r of execution %r failed after %d attempt%s",
            name, self.execution_id, attempt, "" if attempt == 1 else "s",
            exc_info=failure if isinstance(failure, BaseException) else None,
            extra=self._about,
        )
        if self.app.crash_points and self.app.crash_point(self, position, name, "after"):
            self._halt(SimulatedCrash(f"simulated crash after step {name!r}"))
        raise StepFailedError(name, position_text(position), attempt, error_type, message)

    async def _call(
        self,
        fn: Callable[..., Any],
        args: tuple[object, ...],
        in_step: InStep,
        *,
        own_thread: bool = False,
    ) -> Any:
        # The step's function runs with the step's own branch, which refuses durable
        # calls: a replay serves the step without running it, so a call inside would be
        # recorded at a position no replay makes (a thread gets a copy of the context).
        reset = BRANCH.set(in_step)
        try:
            code = getattr(fn, "__code__", None)
            if (
                code is not None and code.co_flags & _CO_COROUTINE
            ) or inspect.iscoroutinefunction(fn):
                return await fn(*args)
            try:
                if own_thread:
                    result = await _in_own_thread(_sync_call, (fn, args))
                else:
                    result = await asyncio.to_thread(_sync_call, fn, args)
            except _StepExited as exc:
                # Raised here, in the step's frame, it unwinds the run's coroutines as a
                # BaseException the step raised does (see _StepExited).
                raise exc.raised from None
            if inspect.isawaitable(result):
                return await result
            return result
        finally:
            BRANCH.reset(reset)

    async def _call_within(
        self, fn: Callable[..., Any], args: tuple[object, ...], in_step: InStep, limit: float
    ) -> Any:
        """:meth:`_call` bounded to ``limit`` seconds: past them the step is cancelled (an
        async one; a sync one runs on a daemon thread of its own, left to finish), and the
        attempt has failed with TimeoutError, whatever the step does after the cancel (a
        result it returns anyway is dropped, an error it raises is chained)."""
        scope = asyncio.timeout(limit)
        failure: Exception | None = None
        try:
            async with scope:
                value = await self._call(fn, args, in_step, own_thread=True)
        except Exception as exc:
            if not scope.expired():
                raise  # the step's own failure, within its bound
            failure = exc.raised if isinstance(exc, _StepStopped) else exc
        if not scope.expired():
            return value
        raise TimeoutError(
            f"step {in_step.name!r} did not finish within its timeout of {limit:g} s "
            f"(attempt {in_step.attempt})"
        ) from failure

    async def sleep(
        self, position: Position, seconds: float | None, until: Any, site: str
    ) -> None:
        if self._recorded(position, "sleep", "", site) is not None:
            return
        earlier = self._earlier_wait(position, "sleep", (), site)
        self._go_live(position, "sleep", "", site, waits=True)
        if earlier is not None:
            wake_at = earlier.wake_at
        elif until is not None:
            wake_at = until
        else:
            assert seconds is not None
            wake_at = self.app.clock.now() + timedelta(seconds=seconds)
        await self._wait(Wait(position, "sleep", wake_at, (), site))

    async def receive(
        self,
        position: Position,
        call: Literal["receive", "receive_any"],
        topics: tuple[str, ...],
        seconds: float | None,
        site: str,
    ) -> Any:
        """A ``receive`` (one topic; the message's value) or a ``receive_any`` (several;
        a :class:`Received`), either None on timeout."""
        recorded = self._recorded_receive(position, call, topics, site)
        if recorded is not None:
            return _taken(recorded)
        earlier = self._earlier_wait(position, call, topics, site)
        self._go_live(position, call, _receive_name(call, topics), site, waits=True)
        if earlier is not None:
            wake_at = earlier.wake_at
        elif seconds is not None:
            wake_at = self.app.clock.now() + timedelta(seconds=seconds)
        else:
            wake_at = None
        wait = Wait(position, call, wake_at, topics, site)
        if self._replay_only:  # what the inbox holds is a live run's to consume
            return await self._wait(wait)
        try:
            message = await self.app.inbox.next(
                self.execution_id, topics, self._consumed, self._cursor
            )
        except LoomError as exc:  # the store's failure, never the body's to catch
            self.app.hooks.storage_error(self.execution_id, exc)
            self._halt(exc)
        self._check_alive()
        if message is not None:
            self._consumed.add(message.sequence)
            any_of = topics if call == "receive_any" else ()
            await self._append(
                [
                    records.consumed(
                        position, message.topic, message.sequence, message.value, any_of
                    )
                ]
            )
            value = fresh(message.value)
            return Received(message.topic, value) if any_of else value
        return await self._wait(wait)

    async def gather(
        self, position: Position, aws: Sequence[Awaitable[Any]], site: str
    ) -> tuple[Any, ...]:
        self._check_alive()
        # A gather records nothing at its own position: what the log holds there is
        # another call, made where the code now gathers (a gather that lost or gained a
        # branch, or a call where one was). Refused before any branch runs.
        view = self._view
        recorded = view.records.get(position)
        if recorded is None and view.retries:
            recorded = view.retries.get(position)
        wait = view.waits.get(position)
        described: str | None = None
        if recorded is not None or wait is not None:
            described = (
                recorded.describe() if recorded is not None else _describe_wait(cast(Wait, wait))
            )
        else:
            # A branch the log holds calls of that the code no longer gathers.
            gathered = self._gathered
            if gathered is None:
                gathered = self._gathered = _gathered(view)
            if position in gathered:
                lost = _branch_calls(view, position, from_branch=len(aws))
                if lost:
                    described = f"a call of branch {lost[0][len(position)]} of this gather"
        if described is not None:
            for aw in aws:  # none will be awaited
                if isinstance(aw, (Durable, Coroutine)):
                    aw.close()
            self._diverge(
                position, described, f"ctx.gather() of {len(aws)} at {site}"
            )
        if not aws:
            return ()
        remaining = len(aws)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settled(_: asyncio.Task[Any]) -> None:
            nonlocal remaining
            remaining -= 1
            if self._quiet or self._stopped:
                return  # the run is over; every branch unwinds
            if remaining == 0:
                self._active += 1  # the gathering branch wakes before its last child leaves
                if not done.done():
                    done.set_result(None)
            self._active -= 1
            self._check_quiet()

        self._active += len(aws) - 1
        tasks: list[asyncio.Task[Any]] = []
        for index, aw in enumerate(aws):
            child = contextvars.copy_context()
            branch = Branch((*position, index), run=self)
            child.run(BRANCH.set, branch)
            task = asyncio.create_task(_await(aw), context=child)
            branch.owner = task  # before it runs: a task starts at the loop's next turn
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(settled)
            tasks.append(task)
        self._blocked.add(done)
        try:
            await done
        except asyncio.CancelledError:
            self.cut(position)
            for task in tasks:
                task.cancel()
            raise
        finally:
            self._blocked.discard(done)
        if self._quiet or self._stopped:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise _Stop if self._stopped else _Park
        if self._gathered and position in self._gathered:
            # Every branch has ended: a call the log holds in one of them that was not
            # made is a branch that now ends sooner. Refused before the body goes on.
            for call in _branch_calls(self._view, position, from_branch=0):
                if call not in self._visited and call in self._view.records:
                    self._diverge(
                        call, self._view.records[call].describe(),
                        f"no call: its branch of the gather at {site} ends before it",
                    )
        # Every branch's failure is taken, also those behind the one raised: asyncio logs
        # a task freed with an exception nobody took as an error ("never retrieved").
        failures = [None if task.cancelled() else task.exception() for task in tasks]
        for task, failure in zip(tasks, failures, strict=True):
            if task.cancelled():
                raise asyncio.CancelledError
            if failure is not None and not isinstance(failure, Exception):
                raise failure
        for failure in failures:
            if isinstance(failure, _OwnCancellation):
                raise failure.raised
            if failure is not None:
                raise failure
        return tuple(task.result() for task in tasks)

    async def set_event(self, position: Position, key: str, value: JsonValue, site: str) -> None:
        if self._recorded(position, "event", key, site) is not None:
            return
        self._go_live(position, "event", key, site)
        if self._frontier:
            return  # past the log: a replay to it publishes nothing
        await self._append([records.step_completed(position, "event", key, value, 1, site)])

    def value(
        self, position: Position, call: str, site: str, draw: Callable[[], JsonValue]
    ) -> JsonValue:
        recorded = self._recorded(position, call, "", site)
        if recorded is not None:
            return recorded.value
        self._go_live(position, call, "", site)
        value = draw()
        if self._frontier:
            return value  # past the log: drawn as a live run would, recorded by none
        self._pending.append(records.step_completed(position, call, "", value, 1, site))
        return value

    def patched(self, branch: Branch, name: str, site: str) -> bool:
        self._check_alive()
        position = branch.peek()
        recorded = self._view.records.get(position)
        if recorded is not None:
            if recorded.call == "patch" and recorded.name == name:
                branch.take()
                self._visited.add(position)
                return True
            self._unpatched.add(name)
            return False
        if (
            name in self._unpatched
            or position in self._view.waits
            or self._has_history(branch)
            or (self._replay_only and not self._frontier)
        ):
            self._unpatched.add(name)
            return False
        branch.take()
        if not self._frontier:
            self._pending.append(records.step_completed(position, "patch", name, None, 1, site))
        return True

    def deprecate_patch(self, branch: Branch, name: str) -> None:
        self._check_alive()
        position = branch.peek()
        recorded = self._view.records.get(position)
        if recorded is not None and recorded.call == "patch" and recorded.name == name:
            branch.take()  # the marker an execution recorded while the patch was checked
            self._visited.add(position)

    # -- replay matching -------------------------------------------------------------------

    def _recorded(self, position: Position, call: str, name: str, site: str) -> Recorded | None:
        self._check_alive()
        recorded = self._view.records.get(position)
        if recorded is None:
            return None
        self._visited.add(position)
        if recorded.call != call or recorded.name != name:
            self._diverge(position, recorded.describe(), _describe_call(call, name, site))
        return recorded

    def _recorded_receive(
        self, position: Position, call: str, topics: tuple[str, ...], site: str
    ) -> Recorded | None:
        if call == "receive":
            return self._recorded(position, call, topics[0], site)
        self._check_alive()
        recorded = self._view.records.get(position)
        if recorded is None:
            return None
        self._visited.add(position)
        if recorded.call != call or set(recorded.topics) != set(topics):
            self._diverge(position, recorded.describe(), _describe_receive(call, topics, site))
        return recorded

    def _earlier_wait(
        self, position: Position, call: str, topics: tuple[str, ...], site: str
    ) -> Wait | None:
        """The unanswered wait an earlier park recorded here (its deadline stands)."""
        earlier = self._view.waits.get(position)
        if earlier is None:
            return None
        if earlier.call != call or set(earlier.topics) != set(topics):
            self._diverge(position, _describe_wait(earlier), _describe_receive(call, topics, site))
        return earlier

    def _go_live(
        self, position: Position, call: str, name: str, site: str, *, waits: bool = False
    ) -> None:
        """Refuse a live call where the log holds an unanswered wait of an earlier park
        (unless this call is that wait), where it holds the branches of a gather, or any
        live call when only replaying."""
        if not waits and (earlier := self._view.waits.get(position)) is not None:
            self._diverge(position, _describe_wait(earlier), _describe_call(call, name, site))
        gathered = self._gathered
        if gathered is None:
            gathered = self._gathered = _gathered(self._view)
        if gathered and position in gathered:
            self._diverge(position, "ctx.gather()", _describe_call(call, name, site))
        if (
            self._view.retries
            and (retrying := self._view.retries.get(position)) is not None
            and (call != "step" or name != retrying.name)
        ):
            self._diverge(position, retrying.describe(), _describe_call(call, name, site))
        if self._replay_only and not self._frontier:
            if self._cut_by_cancel:
                self._stopped = True  # where the cancellation cut the run: replay ends here
                self._release()
                raise _Stop
            self._diverge(position, None, _describe_call(call, name, site))

    def _has_history(self, branch: Branch) -> bool:
        depth = len(branch.prefix)
        for position in (*self._view.records, *self._view.waits, *self._view.retries):
            if (
                len(position) > depth
                and position[:depth] == branch.prefix
                and position[depth] >= branch.counter
            ):
                return True
        return False

    def _check_all_visited(self, attempted: str) -> None:
        retries = self._view.retries
        if retries and (unmet := sorted(set(retries) - self._retried)):
            # A step the log has failed attempts of, that the body no longer makes.
            self._diverge(unmet[0], retries[unmet[0]].describe(), attempted)
        if len(self._visited) == len(self._view.records):
            return  # every visited position is a recorded one
        missing = sorted(set(self._view.records) - self._visited)
        if missing:
            self._diverge(missing[0], self._view.records[missing[0]].describe(), attempted)

    def _diverge(self, position: Position, recorded: str | None, attempted: str | None) -> NoReturn:
        self._halt(
            ReplayDivergedError(self.execution_id, position_text(position), recorded, attempted)
        )

    # -- parking ---------------------------------------------------------------------------

    async def _wait(self, wait: Wait) -> JsonValue:
        """Wait for ``wait``'s answer: the run parks once no branch makes progress. A lone
        wait that is due when the run parks is answered by the run itself, which goes on
        from it with the answer (None for a timer, the message for a receive) rather than
        unwinding and replaying; anything else unwinds the body."""
        self._waits[wait.position] = wait
        self._active -= 1
        if self._check_quiet():
            # This was the last branch making progress.
            if (
                wait.wake_at is not None
                and not self._tasks
                and len(self._waits) == 1
                and not self._replay_only
                and wait.wake_at <= self.app.clock.now()
            ):
                return await self._go_on(wait)
            raise _Park
        await self._until_released()

    async def _until_released(self) -> NoReturn:
        """Block the branch until the run is quiet or stops, then unwind it."""
        blocked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._blocked.add(blocked)
        try:
            await blocked
        finally:
            self._blocked.discard(blocked)
        raise _Stop if self._stopped else _Park

    async def _go_on(self, wait: Wait) -> JsonValue:
        """Park, answer the park at once through the conditional fence, and carry on from
        the view the answer gives, as a new run replayed up to here would (see
        docs/runtime.md, "Timers"). Raises _Park when the answer cannot be
        made here (someone else answered, or the store failed: the timer row is left),
        _Stop when the park itself could not be written."""
        outcome = await self._park()
        if outcome.kind != "suspended":
            raise _Stop
        self._parked_at = outcome.park_seq
        view = advance(self._view, self._seen)  # the view at the park; the run owns it
        self._seen = []
        answered = await self.app.answer_own_park(view, outcome.park_seq)
        if answered is None:
            raise _Park
        self.token, view = answered
        self._start_from(view, set(view.records))  # every recorded call was made by this run
        self._parked_at = -1
        recorded = view.records.get(wait.position)
        return None if recorded is None else _taken(recorded)

    async def _hold(self) -> NoReturn:
        """Hold the branch at a call past the end of the log (a replay to the frontier):
        it makes no progress, as a wait makes none, until the run is quiet or stops."""
        self._beyond += 1
        self._active -= 1
        if self._check_quiet():
            raise _Stop if self._stopped else _Park
        await self._until_released()

    def _frontier_reached(self) -> Outcome:
        """Every branch of a replay to the frontier is held, waits or has ended: it
        matches if every recorded call was made and every wait the log leaves open is
        waited for again (answering it would otherwise record a call no body makes)."""
        try:
            self._check_all_visited("no call: the body stops short of it")
            self._check_waits_reached("no call: the body parks without waiting for it")
        except _Stop:
            return self._outcome("stopped", reason=self._stop_reason)
        return self._outcome("stopped")

    def _check_waits_reached(self, attempted: str) -> None:
        view = self._view
        for position in sorted(view.waits):
            if position not in view.records and position not in self._waits:
                self._diverge(position, _describe_wait(view.waits[position]), attempted)

    def _check_quiet(self) -> bool:
        if (
            self._active == 0
            and (self._waits or self._beyond)
            and not self._stopped
            and not self._quiet
        ):
            self._quiet = True
            self._release()
        elif self._held and 0 < self._active <= self._held:
            # Every branch left waits out a retry's interval: a clock that moves only when
            # told is waiting for this run to settle, and hears it here (its sleep did
            # not, when the branch that settled the run was another one).
            note = getattr(self.app.clock, "note_settled", None)
            if note is not None:
                note()
        return self._quiet

    def _release(self) -> None:
        """Wake every branch blocked in a wait or a gather: the run is quiet or stops."""
        for blocked in self._blocked:
            if not blocked.done():
                blocked.set_result(None)

    # -- stopping and appending ------------------------------------------------------------

    def stop(self) -> None:
        """Stop the run where it is, as a process that exits would: it appends nothing
        more, and its body unwinds at its next durable call."""
        self._stopped = True
        self._release()

    def cut(self, position: Position) -> None:
        """Note that the durable call at ``position`` was cancelled in a task that is being
        cancelled while the run goes on (not stopped, not parking): by the body's own code
        (``asyncio.timeout``, a ``TaskGroup``), since the run cancels only once it stops or
        parks. The call's effects may have happened, unrecorded, and a replay makes it
        again where this run went on without it: the run writes nothing more."""
        if self._cut is None and not (self._stopped or self._quiet) and _being_cancelled():
            self._cut = position

    def _check_cut(self, raised: BaseException | None = None) -> None:
        """Stop the run if the body cancelled one of its calls (see :meth:`cut`); ``raised``,
        what the body ended by raising (a TaskGroup's error, say), is the stop's cause."""
        if self._cut is not None:
            stopped = DurableCallCancelledError(self.execution_id, position_text(self._cut))
            stopped.__cause__ = raised
            self._halt(stopped)

    def _check_alive(self) -> None:
        if self._stopped or self._quiet:
            raise _Stop
        if self._cut is not None:
            self._check_cut()
        if self._deadline is not None:
            self._check_deadline()

    def _check_deadline(self) -> None:
        """Stop the run, writing nothing more, once its execution's deadline has passed:
        a run that began after it (a recovery, a resume) or reached it between two calls
        must not make another call, nor end the execution any other way."""
        assert self._deadline is not None
        if self.app.clock.now() >= self._deadline:
            self._halt(TimedOut(self.execution_id, self._deadline))

    def _halt(self, reason: BaseException) -> NoReturn:
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stopped = True
        self._release()
        raise _Stop

    async def _append(self, events: Sequence[NewEvent]) -> tuple[Event, ...]:
        if not self._tasks:
            return await self._append_now(events)  # one branch: nothing to serialise
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await self._append_now(events)

    async def _flush(self) -> None:
        """Write what the run recorded and has not written yet (see docs/runtime.md, "When
        a result is durable")."""
        if self._pending:
            await self._append(())

    async def _append_now(self, events: Sequence[NewEvent]) -> tuple[Event, ...]:
        if self._stopped:
            raise _Stop
        if self._cut is not None:
            self._check_cut()
        if self._deadline is not None:
            self._check_deadline()
        app = self.app
        hooks = app.hooks
        store = app.storage.events
        while True:  # once, unless more is pending than one append takes
            pending = len(self._pending)
            if pending + len(events) > MAX_EVENTS_PER_APPEND:
                # Thousands of recorded values (ctx.uuid() in a loop) between two writes:
                # the oldest go first, each append one the store takes.
                pending = MAX_EVENTS_PER_APPEND
                batch: Sequence[NewEvent] = self._pending[:pending]
                last = False
            elif pending:
                batch, last = [*self._pending, *events], True
            elif events:
                batch, last = events, True
            else:
                return ()  # a flush another branch's write already made
            if hooks.on_event is not None:
                for new in batch:
                    hooks.event(self.execution_id, new)
            while True:
                try:
                    written = await store.append(
                        self.execution_id, batch, expected_sequence=self._head, fence=self.token
                    )
                    break
                except SequenceConflictError:
                    await self._skip_unfenced_tail(conflicted=True)
                except StaleFenceError as exc:
                    self._halt(FencedOut(self.execution_id, str(exc)))
                except InvalidInputError:
                    raise  # refused before anything was written: the body sees it
                except LoomError as exc:
                    if isinstance(exc, WriteOutcomeUnknownError):
                        app.lost_reply(self.execution_id, self._head, self.token, batch)
                    hooks.storage_error(self.execution_id, exc)
                    self._halt(exc)
            if hooks.store_failing:
                hooks.store_answered()
            if pending:
                # Only what this batch carried: a gather branch may have added more meanwhile.
                del self._pending[:pending]
            self._head = written[-1].sequence + 1
            self._seen.extend(written)
            if hooks.on_durable_event is not None:
                for event in written:
                    hooks.durable_event(event)
            app.changed(self.execution_id)
            if last:
                return written

    async def _skip_unfenced_tail(self, *, conflicted: bool = False) -> None:
        """Someone appended past our head. Audit appends (an unfenced EXECUTION_DENIED, an
        application event) do not take the execution from us: step over them. Anything
        that answers, or carries a newer token, does. ``conflicted``: an append of ours
        was just refused because the head moved."""
        try:
            tail = await self.app.storage.events.read(self.execution_id, from_sequence=self._head)
        except LoomError as exc:
            self.app.hooks.storage_error(self.execution_id, exc)
            self._halt(exc)
        if conflicted and not tail:
            # An append found the head moved, yet nothing is past ours: the log was
            # deleted (or started again shorter) under the run, and is not its to write.
            self._halt(
                FencedOut(self.execution_id, "its log was deleted or replaced under the run")
            )
        for event in tail:
            if is_answering(event) or event.fence > self.token:
                self._halt(
                    FencedOut(
                        self.execution_id,
                        f"event {event.sequence} ({event.kind}) was written by another driver",
                    )
                )
        if tail:
            self._head = tail[-1].sequence + 1
            self._seen.extend(tail)


async def _await(aw: Awaitable[Any]) -> Any:
    """A gather's branch. A CancelledError it raises of its own (its task not cancelled)
    leaves the task as a failure, not as the task's cancellation: the gather then raises
    it, message and all, in argument order with the other branches' failures."""
    try:
        return await aw
    except asyncio.CancelledError as exc:
        if _being_cancelled():
            raise
        raise _OwnCancellation(exc) from None


class _OwnCancellation(Exception):
    """A CancelledError a gather's branch raised of its own, carried out of its task."""

    def __init__(self, raised: asyncio.CancelledError) -> None:
        super().__init__(raised)
        self.raised = raised


class _StepStopped(Exception):
    """A StopIteration a sync step raised, carried out of its thread: asyncio refuses to
    set one on a future (the await would never end), and one raised in a coroutine
    becomes a RuntimeError. The step loop records the StopIteration itself."""

    def __init__(self, raised: StopIteration) -> None:
        super().__init__(raised)
        self.raised = raised


class _StepExited(Exception):
    """A GeneratorExit a sync step raised, carried out of its thread: set on a future, it
    would be thrown into the task that awaits it, and a coroutine thrown a GeneratorExit
    closes the coroutines it awaits instead of unwinding them (the run would end without
    a word, its result never given). Raised again in the step's frame, it stops the run
    as any BaseException a step raises."""

    def __init__(self, raised: GeneratorExit) -> None:
        super().__init__(raised)
        self.raised = raised


def _sync_call(fn: Callable[..., Any], args: tuple[object, ...]) -> Any:
    """``fn(*args)`` for a worker thread, a StopIteration it raises carried in a
    :class:`_StepStopped`, a GeneratorExit in a :class:`_StepExited`."""
    try:
        return fn(*args)
    except StopIteration as exc:
        raise _StepStopped(exc) from None
    except GeneratorExit as exc:
        raise _StepExited(exc) from None


def _being_cancelled() -> bool:
    """Whether the running task is being cancelled: a CancelledError is then the run's own
    (the app leaving, an execute() caller cancelled), not one a step or the body raised."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _message(exc: BaseException) -> str:
    """``str(exc)`` as a store can hold it, or what stands for it when the exception
    cannot say; an exception group's is followed by each of its exceptions' type and
    message (its own says only how many there are: "unhandled errors in a TaskGroup (1
    sub-exception)", and the log keeps no exception object to look into)."""
    try:
        # A plain str: __str__ may return a subclass (an enum mixed with str), which the
        # log records as its plain text and a replay raises so.
        text = str.__str__(str(exc))
    except Exception as failed:
        text = f"<str() of the {type(exc).__name__} raised {type(failed).__name__}>"
    if isinstance(exc, BaseExceptionGroup):
        members = exc.exceptions
        said = [f"{type_name(member)}: {_message(member)}" for member in members[:_SHOWN]]
        if len(members) > _SHOWN:
            said.append(f"and {len(members) - _SHOWN} more")
        text = f"{text}: {'; '.join(said)}"
    return _storable(text)


_SHOWN: Final = 10
"""How many of an exception group's exceptions its recorded message names."""


def _later_by(now: datetime, seconds: float) -> datetime:
    """``now`` plus ``seconds``, kept at LATEST_DEADLINE at the latest (a retry's interval
    may be up to MAX_DURATION, and a clock may be near the calendar's end)."""
    if seconds >= (LATEST_DEADLINE - now).total_seconds():
        return max(now, LATEST_DEADLINE)
    return now + timedelta(seconds=seconds)


def type_name(exc: BaseException) -> str:
    """How the log names ``exc``'s type: its qualified name, after its module's but for a
    built-in one."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return _storable(cls.__qualname__)
    return _storable(f"{cls.__module__}.{cls.__qualname__}")


def _storable(text: str) -> str:
    """``text`` with what no store can hold escaped: U+0000 as ``\\x00``, a lone
    surrogate as ``\\udc80``; a message is recorded as the error's own words, not
    refused for them."""
    if text.isascii():
        return text if "\x00" not in text else text.replace("\x00", "\\x00")
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


async def _in_own_thread(fn: Callable[..., Any], args: tuple[object, ...]) -> Any:
    """``fn(*args)`` on a daemon thread of its own, in a copy of the caller's context: a
    bounded sync step, which its bound cannot stop, so that one left running takes no
    worker of the shared executor from the steps after it, and never holds up the
    process's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, failure: BaseException | None) -> None:
        if done.done():
            return  # given up on at the bound
        if failure is not None:
            done.set_exception(failure)
        else:
            done.set_result(value)

    def run() -> None:
        value: Any = None
        failure: BaseException | None = None
        try:
            value = context.run(fn, *args)
        except BaseException as exc:
            failure = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, failure)

    threading.Thread(target=run, name="loom-step", daemon=True).start()
    return await done


def _furthest(view: View) -> dict[Position, int]:
    """For each line of calls the log holds calls of (the body's, ``()``, and each gather
    branch's, by its prefix), the greatest index it holds a call at."""
    furthest: dict[Position, int] = {}
    for position in (*view.records, *view.waits, *view.retries):
        for depth in range(0, len(position), 2):
            prefix = position[:depth]
            if furthest.get(prefix, -1) < position[depth]:
                furthest[prefix] = position[depth]
    return furthest


def _gathered(view: View) -> frozenset[Position]:
    """The positions of the gathers whose branches the log holds calls of: a branch's
    position is its gather's, its index, and its own count (``(4, 1, 0)``: the first
    call of the second branch of the gather at 4), nested as gathers nest."""
    return frozenset(
        position[:depth]
        for position in (*view.records, *view.waits, *view.retries)
        for depth in range(1, len(position), 2)
    )


def _branch_calls(view: View, gather: Position, *, from_branch: int) -> list[Position]:
    """The positions the log holds inside the branches of the gather at ``gather`` whose
    index is ``from_branch`` or more, in order."""
    depth = len(gather)
    return sorted(
        position
        for position in (*view.records, *view.waits, *view.retries)
        if len(position) > depth + 1
        and position[:depth] == gather
        and position[depth] >= from_branch
    )


def _describe_call(call: str, name: str, site: str) -> str:
    """How a divergence names the call the body attempted."""
    if call == "step":
        what = f"step {name!r}"
    elif call == "event":
        what = f"set_event({name!r})"
    elif call == "receive":
        what = f"receive({name!r})"
    elif call == "receive_any":
        what = name  # describe_any's, made by _receive_name
    elif call == "sleep":
        what = "sleep()"
    else:
        what = f"{call}()"
    return f"{what} at {site}"


def _describe_wait(wait: Wait) -> str:
    if wait.call == "sleep":
        what = "sleep()"
    elif wait.call == "receive":
        what = f"receive({wait.topics[0]!r})"
    else:
        what = describe_any(wait.topics)
    return what + (f" at {wait.site}" if wait.site else "")


def _describe_receive(call: str, topics: tuple[str, ...], site: str) -> str:
    return _describe_call(call, _receive_name(call, topics), site)


def _receive_name(call: str, topics: tuple[str, ...]) -> str:
    """A receive's name in a divergence: its topic, or a receive_any described whole."""
    return topics[0] if call == "receive" else describe_any(topics)


def _taken(recorded: Recorded) -> Any:
    """What a recorded receive gives the body again: the message's value for a
    ``receive``, a :class:`Received` for a ``receive_any``; None for a timeout."""
    if recorded.call == "receive_any":
        return Received(recorded.name, fresh(recorded.value)) if recorded.name else None
    return fresh(recorded.value)

