"""The app: :class:`Loom` registers workflows, starts and drives executions, and runs the
services a node needs (the timer service, recovery of its own executions)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import math
import random as random_module
import socket
import types
import uuid
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
    Set,
)
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import (
    Any,
    Concatenate,
    Final,
    Generic,
    Literal,
    TypeAlias,
    TypeVar,
    TypeVarTuple,
    cast,
    final,
    overload,
)

from loom_core import (
    Event,
    EventKind,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    JsonValue,
    LoomError,
    NewEvent,
    PayloadShreddedError,
    SequenceConflictError,
    StaleFenceError,
    Storage,
    StorageError,
    StoreClosedError,
    TimerRecord,
    WriteOutcomeUnknownError,
    open_storage,
)
from loom_core.spi import MAX_EVENTS_PER_APPEND, MAX_ID_BYTES, check_execution_id
from loom_runtime import records
from loom_runtime.clock import (
    LATEST_DEADLINE,
    MAX_DURATION,
    Clock,
    RandomSource,
    SystemClock,
    lacking,
    shown,
)
from loom_runtime.code_digest import code_digest
from loom_runtime.context import Context, check_end, seconds_of
from loom_runtime.driver import (
    FencedOut,
    Outcome,
    Run,
    SimulatedCrash,
    Successor,
    TimedOut,
    type_name,
)
from loom_runtime.errors import (
    ActionDeniedError,
    AppNotRunningError,
    ExecutionCancelledError,
    ExecutionTimedOutError,
    InvalidDurationError,
    LogFormatError,
    OtherEventLoopError,
    RecoveryLimitError,
    ReplayDivergedError,
    ReservedExecutionIdError,
    ResultTimeoutError,
    ResumeContendedError,
    ResumeRefusedError,
    RunStoppedError,
    WorkflowFailedError,
    WorkflowNotFoundError,
    shown_safely,
)
from loom_runtime.fold import Recorded, Status, View, completion_result, fold
from loom_runtime.hooks import Hooks, OnDurableEvent, OnError, OnEvent, OnStorageError
from loom_runtime.inbox import Inbox, Message
from loom_runtime.records import (
    INBOX_PREFIX,
    SUCCESSOR_SUFFIX,
    Position,
    Wait,
    check_text,
    fresh,
    inbox_of,
    json_arguments,
    json_value,
)
from loom_runtime.resume import answer_park, read_tail, still_parked, tail_past_conflict
from loom_runtime.schedules import Schedule, Scheduler, check_schedule, tick_id
from loom_runtime.timers import Fired, TimerService

__all__ = ["Authorize", "CrashPoint", "Handle", "Loom"]

_log = logging.getLogger("loom_runtime")

CANCEL_AGAIN_AFTER: Final = 1.0
"""Seconds an app leaving ``async with`` gives a cancelled task to end before it cancels it
again (see _stop_tasks)."""

CARRY_ON_AFTER: Final = 1.0
CARRY_ON_CAP: Final = 30.0
"""A run this process drove that stopped because a store call failed is carried on in the
background: first CARRY_ON_AFTER seconds later, then after twice as long each time the
store fails again, at most CARRY_ON_CAP seconds (each wait drawn between half and all of
it, so the executions an outage stopped do not all come back at once)."""

QUIET_RIVAL_AFTER: Final = 30.0
QUIET_RIVAL_CAP: Final = 3600.0
"""A run of this process fenced out by a token after which nothing was written (its
taker died between its token and its record: a cancel, say) is carried on by this
process when the log has stayed so for QUIET_RIVAL_AFTER seconds; for the same execution
again, after twice as long each time, at most QUIET_RIVAL_CAP seconds (see
docs/design.md, "A token and nothing after it")."""

SENDER_GRACE: Final = timedelta(seconds=60)
"""How long a timer service waits for the message of a sender's wake row to be stored
before it retires the row as having nothing to answer (docs/design.md, "Resuming a park")."""

R = TypeVar("R")
Args = TypeVarTuple("Args")
# A body takes ctx first: a checker flags one that does not where it is registered.
F = TypeVar("F", bound=Callable[Concatenate[Context, ...], Awaitable[Any]])
# A scheduled body takes the instant, an ISO 8601 str, after ctx.
S = TypeVar("S", bound=Callable[[Context, str], Awaitable[Any]])

Authorize: TypeAlias = Callable[[object, str, str], "bool | Awaitable[bool]"]
"""``authorize(principal, action, execution_id)``: True allows ``action`` (``"resume"``,
``"cancel"`` or ``"fork"``); False refuses it, and a refused resume or cancel is recorded
as EXECUTION_DENIED (a fork writes nothing to the execution it would copy)."""

CrashPoint: TypeAlias = Callable[[str, Position, str, str], bool]
"""``(execution_id, position, call name, "before" | "after") -> crash now?`` (the test kit's
crash injection; see :mod:`loom_runtime.testing`)."""

DecoratorSpec: TypeAlias = "str | tuple[str, Mapping[str, object]]"

MAX_RECOVERIES: Final = 100
"""A workflow's ``max_recoveries`` when its registration does not say: what DBOS gives
its ``max_recovery_attempts``."""

IfExists: TypeAlias = Literal["raise", "attach"]
"""What ``app.start`` and ``app.execute`` do with an id that has an execution already:
refuse it with ExecutionAlreadyExistsError, or attach to that execution."""


_Outgoing: TypeAlias = tuple[str, JsonValue, str | None]
"""A message to store: its topic, value and key."""
_Hop: TypeAlias = tuple[str, list[_Outgoing]]
"""What a generation that continued as new left, for its successor (named first)."""


@dataclass(frozen=True, slots=True)
class _Strand:
    """A stranded execution: when to take it back, and whether that is a node's
    recovery (counted against ``max_recoveries``) rather than a carry-on."""

    not_before: datetime
    limited: bool = False
    fence_first: bool = True
    """Take a token before taking it back (see Loom._take_back)."""
    settled: Callable[[View], bool] | None = None
    """Whether a log shows the write in flight can no longer land (see Loom._take_back)."""
    quiet_at: int | None = None
    """For a run fenced out by a token after which nothing was written: the log's head
    then. The execution is carried on only if it is still there (nothing written since)."""


@dataclass(frozen=True, slots=True)
class _Unheard:
    """A write of this process whose outcome was not learned: ``batch`` appended at
    ``sequence`` under ``fence``, maybe."""

    sequence: int
    fence: int
    batch: tuple[NewEvent, ...]


@final
class Handle(Generic[R]):
    """A started execution, wherever it runs. Waiting follows continue-as-new chains."""

    __slots__ = ("_app", "execution_id")

    def __init__(self, app: Loom, execution_id: str) -> None:
        self._app = app
        self.execution_id = execution_id

    def __repr__(self) -> str:
        return f"Handle({self.execution_id!r})"

    async def view(self) -> View:
        """The execution as its log says it is (see :func:`loom_runtime.fold.fold`)."""
        view = await self._app.inspect(self.execution_id)
        if view.status is None:
            raise ExecutionNotFoundError(self.execution_id)
        return view

    async def status(self) -> Status:
        """``running``, ``suspended``, ``completed``, ``failed``, ``cancelled`` or
        ``continued``."""
        view = await self.view()
        assert view.status is not None
        return view.status

    async def send(self, topic: str, value: object = None, *, key: str | None = None) -> int:
        """``app.send`` to this execution: store a message, then wake it."""
        return await self._app.send(self.execution_id, topic, value, key=key)

    async def cancel(self, *, reason: str | None = None, principal: object = None) -> bool:
        """``app.cancel`` of this execution; False if it had finished."""
        return await self._app.cancel(self.execution_id, reason=reason, principal=principal)

    async def get_event(
        self, key: str, timeout: float | timedelta | None = None  # noqa: ASYNC109 (the API)
    ) -> JsonValue:
        """``app.get_event`` of this execution: the latest value published under ``key``."""
        return await self._app.get_event(self.execution_id, key, timeout)

    async def result(self, timeout: float | timedelta | None = None) -> R:  # noqa: ASYNC109 (the API)
        """The workflow's return value, once it has one (following continue-as-new).

        Raises WorkflowFailedError, ExecutionCancelledError, ReplayDivergedError or
        RunStoppedError (when the run in this process diverged, or its body raised a
        BaseException or went on past a durable call it cancelled) or ResultTimeoutError
        after ``timeout`` (seconds or a timedelta); AppNotRunningError when the app is
        left while it waits (a storage the caller opened stays open, but nothing of this
        process drives the execution any more).
        """
        timeout = _check_timeout(timeout)
        self._app.check_loop("handle.result()")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        began = self._app.running
        try:
            return await self._wait_result(self.execution_id, loop, deadline, timeout or 0)
        except (StoreClosedError, AppNotRunningError) as exc:
            if self._app.running:
                raise
            # The app was left while this waited (its storage closed under a read, or a
            # storage of the caller's own still open), or was not running at all.
            raise AppNotRunningError("handle.result()", left=began) from exc

    async def _wait_result(
        self,
        execution_id: str,
        loop: asyncio.AbstractEventLoop,
        deadline: float | None,
        bound: float,
    ) -> R:
        """result()'s wait for ``execution_id``'s end, by ``deadline`` (``bound`` seconds
        from when it began, for the error that says it passed)."""
        interval = 0.01
        changed: asyncio.Event | None = None
        try:
            while True:
                # A run in this process ends with the log's last word on a finished
                # execution (nothing changes a log after its terminal event): wait for it
                # rather than reading the log after every append. Otherwise watch before
                # reading, so a write between the read and the wait still wakes us. The log
                # is read each second meanwhile: another process's cancel fences the run
                # out, and it hears of that only at its next write.
                last = await self._app._local_end(execution_id, _remaining(loop, deadline))
                if last is not None:
                    if last.kind == EventKind.EXECUTION_COMPLETED:
                        done: R = completion_result(last)  # type: ignore[assignment]
                        return done
                    view = fold([last])  # a terminal event says all a result needs
                else:
                    changed = self._app.watch(execution_id)
                    view = await self._app.inspect(execution_id)
                if view.status == "continued":
                    assert view.successor is not None
                    if changed is not None:
                        self._app.unwatch(execution_id, changed)
                        changed = None
                    execution_id = view.successor
                    continue
                self._check_result_ready(view, execution_id)  # raises if it ended otherwise
                if view.status == "completed":
                    result: R = view.result  # type: ignore[assignment]
                    return result
                assert view.status is not None
                wait = interval
                remaining = _remaining(loop, deadline)
                if remaining is not None:
                    if remaining <= 0:
                        raise ResultTimeoutError(
                            self.execution_id, float(bound), view.status,
                            self._app._why_not_moving(view),
                        )
                    wait = min(wait, remaining)
                if not self._app.running:
                    # Nothing of this process drives it any more: a wait on a storage the
                    # caller opened would read it for ever.
                    raise AppNotRunningError("handle.result()")
                await self._app.wait_changed(execution_id, wait, changed)  # unwatches it
                changed = None
                interval = min(interval * 2, 1.0)
        finally:
            if changed is not None:
                self._app.unwatch(execution_id, changed)

    def _check_result_ready(self, view: View, execution_id: str) -> None:
        """Raise what ``result()`` raises for ``view``: its failure, its cancellation,
        the halt of its run in this process, or that it does not exist. A failure or a
        cancellation names the handle's execution, the id the caller knows, even when a
        successor it continued as ended so."""
        if view.status is None:
            raise ExecutionNotFoundError(execution_id)
        halted = self._app.halted
        if halted and view.terminal:
            halted.pop(execution_id, None)  # it ended since, elsewhere
        if view.status == "failed":
            assert view.error is not None
            raise WorkflowFailedError(self.execution_id, *view.error)
        if view.status == "cancelled":
            if view.timed_out:
                raise ExecutionTimedOutError(self.execution_id, view.cancel_reason)
            raise ExecutionCancelledError(self.execution_id, view.cancel_reason)
        if not view.terminal and (stopped := halted.get(execution_id)) is not None:
            raise stopped


def _check_node(node: object, what: str = "Loom(node=...)") -> str:
    """A valid node name: a non-empty str that an event may hold (every drive records it)."""
    if not isinstance(node, str) or not node:
        raise InvalidOptionError(f"{what} must be a non-empty str, not {node!r}")
    try:
        check_text(node, what)
    except InvalidInputError as exc:
        raise InvalidOptionError(str(exc)) from None
    return node


class Loom:
    """A durable-workflow app on one storage.

    ``Loom("sqlite:///orders.db")`` opens the storage when the app is entered
    (``async with app:``) and closes it at the exit; ``Loom(storage)`` uses a
    :class:`~loom_core.Storage` you opened (and close) yourself. Inside ``async with``
    the app drives the executions it starts or resumes in this process, fires due timers
    and re-drives the executions its ``node`` was running when it last died.

    ``node`` names this process's failure domain (default: the host name): give every
    process that drives executions its own, stable name, so that a restart of ``web-1``
    recovers exactly ``web-1``'s work.
    """

    def __init__(
        self,
        storage: str | Storage,
        *,
        decorators: Sequence[DecoratorSpec] | None = (),
        options: Mapping[str, object] | None = None,
        node: str | None = None,
        on_error: OnError | None = None,
        on_event: OnEvent | None = None,
        on_durable_event: OnDurableEvent | None = None,
        on_storage_error: OnStorageError | None = None,
        authorize: Authorize | None = None,
        clock: Clock | None = None,
        random: RandomSource | None = None,
        poll_interval: float = 0.25,
        timers: bool = True,
        recover: bool = True,
    ) -> None:
        if isinstance(storage, Storage):
            if decorators or options:
                raise InvalidOptionError(
                    "decorators= and options= apply when Loom opens the storage from a URL; "
                    "pass them to open_storage() for a Storage you open yourself"
                )
            self._url: str | None = None
            self._storage: Storage | None = storage
        elif isinstance(storage, str):
            self._url = storage
            self._storage = None
        else:
            raise InvalidOptionError(
                f"Loom() takes a storage URL or a Storage, not {type(storage).__name__}"
            )
        node = _check_node(socket.gethostname() or "local" if node is None else node)
        if authorize is not None and not callable(authorize):
            raise InvalidOptionError(f"Loom(authorize=...) must be callable, not {authorize!r}")
        if clock is not None:
            if lacking(clock, Clock):
                raise InvalidOptionError(
                    f"Loom(clock=...) must have now() and sleep(), not {clock!r}"
                )
            now = clock.now()
            if not isinstance(now, datetime) or now.utcoffset() is None:
                raise InvalidOptionError(
                    f"Loom(clock=...)'s now() must give a timezone-aware datetime (UTC), "
                    f"not {now!r}: deadlines and recorded times are compared across nodes"
                )
        if random is not None and lacking(random, RandomSource):
            raise InvalidOptionError(
                f"Loom(random=...) must have random() and getrandbits(), not {random!r}"
            )
        if (
            not isinstance(poll_interval, int | float)
            or isinstance(poll_interval, bool)
            or not 0 < poll_interval < math.inf  # NaN compares false
        ):
            raise InvalidOptionError(
                f"Loom(poll_interval=...) must be a finite number of seconds > 0, not "
                f"{poll_interval!r}"
            )
        for flag, value in (("timers", timers), ("recover", recover)):
            if not isinstance(value, bool):
                raise InvalidOptionError(f"Loom({flag}=...) must be True or False, not {value!r}")
        if decorators is None:
            decorators = ()
        if isinstance(decorators, str | bytes) or not isinstance(decorators, Sequence):
            raise InvalidOptionError(
                f"Loom(decorators=...) must be a list of decorator specs (e.g. ['tenant']), "
                f"not {decorators!r}"
            )
        for spec in decorators:  # their names resolve when the storage opens
            if not isinstance(spec, str) and not (
                isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str)
                and isinstance(spec[1], Mapping)
            ):
                raise InvalidOptionError(
                    f"Loom(decorators=...) takes decorator names or (name, options) pairs, "
                    f"innermost first (e.g. ['tenant']), not {spec!r}"
                )
        if options is not None and not isinstance(options, Mapping):
            raise InvalidOptionError(
                f"Loom(options=...) must be a mapping of the backend's options, not {options!r}"
            )
        self._decorators = tuple(decorators)
        self._options = options
        self.node = node
        self.hooks = Hooks(
            on_event=on_event,
            on_durable_event=on_durable_event,
            on_storage_error=on_storage_error,
            on_error=on_error,
        )
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.random: RandomSource = random if random is not None else random_module.Random()
        self._authorize = authorize
        self.timer_service = TimerService(self, poll_interval=float(poll_interval))
        self.scheduler = Scheduler(self)
        # Drains in progress; the scheduler starts nothing new while there are some.
        self._draining = 0
        self._undrained = asyncio.Event()
        self._undrained.set()
        self._serve_timers = timers
        self._recover_on_enter = recover
        self._workflows: dict[str, Callable[..., Awaitable[Any]]] = {}
        self._names: dict[Callable[..., Awaitable[Any]], str] = {}
        self._fingerprints: dict[str, str] = {}
        # What each workflow's body takes after ctx: the fewest and the most positional
        # arguments (None: any number).
        self._arity: dict[str, tuple[int, int | None]] = {}
        self._max_recoveries: dict[str, int | None] = {}
        # The task driving each execution: the app's own, or an execute() caller's.
        self._runs: dict[str, asyncio.Task[Any]] = {}
        # Every drive task until it ends: a task leaves _runs when its run parks or ends,
        # and may then still answer its own park and drive on (see _drive).
        self._driving: set[asyncio.Task[Any]] = set()
        # execute() calls driving in their callers' tasks: a future done when each stops,
        # and the task it drives in.
        self._inline: dict[asyncio.Future[None], asyncio.Task[Any] | None] = {}
        # The end a call of this process wrote for an execution whose run here winds down
        # (a step in flight returns first), with the task of that run: what a result()
        # waiting for that run is told (not one for a log made anew under the same id).
        self._ended: dict[str, tuple[asyncio.Task[Any], Event]] = {}
        self._drivers: dict[str, Run] = {}
        # Executions a call of this process ended (a cancel) while a write of its own (a
        # start, an answer, a continuation) was about to spawn their next run: that run
        # is stopped as it is taken on, before its body makes a call (see _append_end).
        self._ended_unspawned: set[str] = set()
        # Executions a task of the app is taking back after a cancelled call (_take_back).
        self._taking_back: set[str] = set()
        self._unheard: dict[str, list[_Unheard]] = {}
        # Executions whose run stopped on a failed store call, to carry on (_strand).
        self._stranded: dict[str, _Strand] = {}
        # Quiet rivals' takeovers in a row per execution (see _watch_quiet_rival).
        self._quiet_takeovers: dict[str, int] = {}
        # When the carry-on's sleep ends, while it sleeps (see _strand).
        self._carry_on_wakes: datetime | None = None
        # The recovery on entering could not list the executions (the store, or a shard
        # of it, failed): the carry-on tries it again.
        self._relist = False
        # The type of error the listing's last failure reported to on_error, and how many
        # listings failed in a row: a store down for hours fails one every 30 s.
        self._relist_failing: type[Exception] | None = None
        self._relist_failures = 0
        self._carrying_on: asyncio.Task[None] | None = None
        self._ends: dict[str, list[asyncio.Future[Event | None]]] = {}
        # The timer that wakes those waiting for a run here to read the log (see
        # _look_again), and the waits it woke.
        self._look_timer: asyncio.TimerHandle | None = None
        self._looked: set[asyncio.Future[Event | None]] = set()
        # One event per reader watching an execution, each taken away when its reader is
        # done (see unwatch), so reads of executions never written again (a finished
        # one's result, its events) leave nothing behind.
        self._signals: dict[str, list[asyncio.Event]] = {}
        self._resumers: dict[str, _Resumers] = {}
        self._reusing: dict[str, _Resumers] = {}  # starts of an id used before, in line
        # Executions whose next run this process is about to drive: written (a start, a
        # successor's start, a takeover, an answer to its own park) but not yet spawned.
        # Recovery waits for such a write to be answered (see _unowned_view).
        self._claims: dict[str, int] = {}
        self._unclaimed_waiters: dict[str, asyncio.Event] = {}
        self._services: list[asyncio.Task[Any]] = []
        self._entered = False
        # The event loop the app was entered in, while entered: its tasks, futures and
        # storage belong to it, so calls from any other loop are refused (see check_loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recovering: asyncio.Task[Any] | None = None  # the recovery on entering
        # What this process drove since it entered, while the recovery on entering has not
        # finished: that recovery is for what a previous process left, and leaves these
        # (a run the test kit's crash_at stopped, say) to app.recover().
        self._driven_here: set[str] | None = None
        # Long logs' views, and the event each was folded to (see _look).
        self._views: OrderedDict[str, tuple[View, Event]] = OrderedDict()
        self.timer_task: asyncio.Task[None] | None = None  # the timer service's, while entered
        self._owns_storage = False
        self._inbox: Inbox | None = None
        # Runs of this process that stopped for a reason handle.result() raises here.
        self.halted: dict[str, LoomError] = {}
        self.crash_points: list[CrashPoint] = []

    # -- registration ----------------------------------------------------------------------

    @overload
    def workflow(self, fn: F, /) -> F: ...
    @overload
    def workflow(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        max_recoveries: int | None = MAX_RECOVERIES,
    ) -> Callable[[F], F]: ...
    def workflow(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        max_recoveries: int | None = MAX_RECOVERIES,
    ) -> Any:
        """Register an ``async def body(ctx, *args)``, as ``@app.workflow()`` or
        ``@app.workflow``; ``name`` (what the log records and what a resume looks up)
        defaults to the function's qualified name. One function registered under several
        names (an old name kept for the executions started under it) is started under
        the last.

        ``max_recoveries``: an execution that a node's recovery has taken over this many
        times in a row, its run dying each time before it wrote anything, is failed with
        RecoveryLimitError at the next recovery instead of run again (a body that kills
        its process would otherwise kill the node at each start); None never gives up.
        """
        if max_recoveries is not None and (
            not isinstance(max_recoveries, int)
            or isinstance(max_recoveries, bool)
            or max_recoveries < 1
        ):
            raise InvalidOptionError(
                f"max_recoveries= is how many recoveries in a row without progress an "
                f"execution gets before it is failed, an int >= 1, or None for no limit; "
                f"not {max_recoveries!r}"
            )

        def register(fn: F) -> F:
            if not inspect.iscoroutinefunction(fn):
                raise InvalidOptionError(_not_a_body(fn))
            workflow_name = name if name is not None else getattr(fn, "__qualname__", None)
            if workflow_name is None:
                raise InvalidOptionError(
                    f"{fn!r} has no __qualname__ to name the workflow by: pass "
                    "@app.workflow(name=...)"
                )
            if not isinstance(workflow_name, str) or not workflow_name:
                raise InvalidOptionError(f"a workflow name must be a non-empty str: {name!r}")
            check_text(workflow_name, "a workflow name")
            if workflow_name in self._workflows and self._workflows[workflow_name] is not fn:
                raise InvalidOptionError(
                    f"a workflow named {workflow_name!r} is already registered on this app; "
                    "pass @app.workflow(name=...) to tell them apart"
                )
            arity = _arity(fn)
            self._workflows[workflow_name] = fn
            self._names[fn] = workflow_name
            self._fingerprints.pop(workflow_name, None)  # taken at its first use
            self._arity[workflow_name] = arity
            self._max_recoveries[workflow_name] = max_recoveries
            return fn  # type: ignore[return-value]  # the same object, registered

        return register if fn is None else register(fn)

    def scheduled(
        self,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        name: str | None = None,
    ) -> Callable[[S], S]:
        """Start the workflow below at each instant of ``cron`` (a five-field cron
        expression, in UTC) or every ``every`` seconds (counted from the Unix epoch),
        with the instant (an ISO 8601 str) as its one argument after ``ctx``::

            @app.scheduled(cron="0 9 * * MON-FRI")
            @app.workflow()
            async def report(ctx: Context, scheduled_at: str) -> None: ...

        Each instant's execution has the id ``<name>@<instant>`` (``name`` defaults to
        the workflow's), started by whichever node serving timers comes first and found
        by the others. Instants that pass while no node serves the schedule are not made
        up for. Refused with InvalidOptionError: not exactly one of ``cron`` and
        ``every``, an expression cronsim cannot read, an interval under a second, a
        workflow this app has not registered (put ``@app.scheduled`` above
        ``@app.workflow``) or one that does not take one argument, a name already used
        by another schedule.
        """

        def register(fn: S) -> S:
            try:
                workflow = self._resolve(fn)[0]
            except WorkflowNotFoundError:
                raise InvalidOptionError(
                    f"@app.scheduled needs a workflow this app has registered, not {fn!r}: "
                    "put @app.scheduled(...) above @app.workflow()"
                ) from None
            least, most = self._arity[workflow]
            if not (least <= 1 and (most is None or most >= 1)):
                raise InvalidOptionError(
                    f"a scheduled workflow takes one argument after ctx (the instant, an "
                    f"ISO 8601 str): workflow {workflow!r} does not"
                )
            schedule_name = workflow if name is None else name
            if not isinstance(schedule_name, str) or not schedule_name:
                raise InvalidOptionError(f"a schedule's name must be a non-empty str: {name!r}")
            try:
                check_text(schedule_name, "a schedule's name")
            except InvalidInputError as exc:
                raise InvalidOptionError(str(exc)) from None
            try:
                _check_new_id(tick_id(schedule_name, LATEST_DEADLINE))
            except LoomError as exc:
                raise InvalidOptionError(
                    f"schedule name {schedule_name!r} does not make execution ids a start "
                    f"takes: {exc}"
                ) from None
            schedule = check_schedule(schedule_name, workflow, cron, every)
            known = self.scheduler.schedules.get(schedule_name)
            if known is not None and known != schedule:
                raise InvalidOptionError(
                    f"a schedule named {schedule_name!r} is already registered on this app; "
                    "pass @app.scheduled(name=...) to tell them apart"
                )
            self.scheduler.add(schedule)
            return fn

        return register

    @property
    def schedules(self) -> Mapping[str, Schedule]:
        """The schedules registered on this app, by name."""
        return types.MappingProxyType(self.scheduler.schedules)

    @property
    def workflows(self) -> Mapping[str, Callable[..., Awaitable[Any]]]:
        return types.MappingProxyType(self._workflows)

    def _resolve(self, workflow: object) -> tuple[str, Callable[..., Awaitable[Any]]]:
        if isinstance(workflow, str):
            fn = self._workflows.get(workflow)
            if fn is None:
                raise WorkflowNotFoundError(workflow, known=tuple(self._workflows))
            return workflow, fn
        if callable(workflow):
            registered = self._names.get(cast("Callable[..., Awaitable[Any]]", workflow))
            if registered is not None:
                return registered, self._workflows[registered]
        raise WorkflowNotFoundError(
            getattr(workflow, "__qualname__", repr(workflow)), known=tuple(self._workflows)
        )

    def check_arguments(self, name: str, count: int, what: str = "app.start") -> None:
        """Refuse ``count`` positional arguments (after ``ctx``) that the body of workflow
        ``name`` cannot take, before anything is written: a start that wrote its
        EXECUTION_STARTED only for the body to fail on its signature would use up the
        id."""
        least, most = self._arity.get(name, (0, None))
        if least <= count and (most is None or count <= most):
            return
        if most is None:
            takes = f"at least {least}"
        elif least == most:
            takes = str(least)
        else:
            takes = f"{least} to {most}"
        raise InvalidInputError(
            f"workflow {name!r} takes {takes} argument{'' if takes == '1' else 's'} after "
            f"ctx, not {count}: {what} passed {count}; nothing was written"
        )

    def _body_of(self, view: View) -> Callable[..., Awaitable[Any]]:
        fn = self._workflows.get(view.workflow)
        if fn is None:
            raise WorkflowNotFoundError(view.workflow, view.execution_id, tuple(self._workflows))
        return fn

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            raise AppNotRunningError("app.storage of a Loom opened from a URL")
        return self._storage

    @property
    def inbox(self) -> Inbox:
        if self._inbox is None:
            self._inbox = Inbox(self.storage.events)
        return self._inbox

    def _rename_node(self, node: object, what: str) -> None:
        """Serve as ``node`` rather than the name the app was built with (``loom worker
        --node``: several worker processes of one app module). Refused once entered: the
        runs it drives are recorded under the name it entered with."""
        node = _check_node(node, what)
        if self._entered:
            raise InvalidOptionError(
                f"this Loom app already runs as node {self.node!r}; name its node before "
                "entering it"
            )
        self.node = node

    async def __aenter__(self) -> Loom:
        if self._entered:
            if self._loop is not None and self._loop.is_closed():
                raise OtherEventLoopError("async with app", closed=True)
            raise InvalidOptionError("this Loom app is already running; enter it once")
        if self._storage is None:
            assert self._url is not None
            self._storage = await open_storage(
                self._url, decorators=self._decorators, options=self._options
            )
            self._owns_storage = True
        elif self._storage.closed:
            raise StoreClosedError(repr(self._storage))
        self._inbox = Inbox(self._storage.events)
        self._entered = True
        self._loop = asyncio.get_running_loop()
        # An asyncio.Event is tied to the first loop that waits on it: a fresh one for
        # each entry, as the entry may be in a new loop (each test's, with pytest-asyncio).
        self._undrained = asyncio.Event()
        if not self._draining:
            self._undrained.set()
        if self._serve_timers:
            self.timer_task = asyncio.create_task(self.timer_service.run())
            self._services.append(self.timer_task)
            self.scheduler.start()
        if self._recover_on_enter:
            self._driven_here = set()
            self._recovering = asyncio.create_task(self._quietly(self._recover_on_entering))
            self._services.append(self._recovering)
        attach = getattr(self.clock, "attach", None)
        if attach is not None:
            attach(self)  # a clock that moves only when told (the test kit's)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._entered = False
        self._loop = None
        detach = getattr(self.clock, "detach", None)
        if detach is not None:
            detach(self)
        # Runs stop where they are, as a process that exits would: the log keeps them, and
        # the node's next start recovers what was running. Each run is stopped (it appends
        # nothing more, and its body unwinds at its next durable call) before the tasks
        # are cancelled: a step that swallows its cancellation must not let its run go on.
        # A run in an execute() caller's task is stopped, not its task.
        kept_aside = self.stranded
        if self._runs or kept_aside:
            stopped = sorted({*self._runs, *kept_aside})
            _log.warning(
                "leaving the app leaves %d running execution(s) of node %r with nothing to "
                "drive them (%s%s); the next start of a process with node=%r carries them "
                "on (await app.drain() before leaving lets runs reach their next park or "
                "end)",
                len(stopped), self.node, ", ".join(map(repr, stopped[:5])),
                ", ..." if len(stopped) > 5 else "", self.node,
            )
        for run in self._drivers.values():
            run.stop()
        carrying_on = [] if self._carrying_on is None else [self._carrying_on]
        await _stop_tasks(
            [*self._services, *self.scheduler.tasks(), *carrying_on, *self._driving]
        )
        self._services.clear()
        self.scheduler.stopped()
        self._recovering = None
        self._driven_here = None
        self.timer_task = None
        self._carrying_on = None
        self._relist = False
        # An outage met while the app ran is this entry's: the next entry reports its own.
        self._relist_failing = None
        self._relist_failures = 0
        self.timer_service.app_left()
        self.hooks.app_left()
        self._stranded.clear()
        self._quiet_takeovers.clear()
        self._runs.clear()
        self._driving.clear()
        self._drivers.clear()
        for ends in self._ends.values():  # runs cancelled before they began
            for end in ends:
                if not end.done():
                    end.set_result(None)
        self._ends.clear()
        for execution_id in list(self._signals):  # the waits of result(), get_event()
            self.changed(execution_id)
        self._looked.clear()
        if self._look_timer is not None:
            self._look_timer.cancel()
            self._look_timer = None
        self._ended.clear()
        self._ended_unspawned.clear()
        self._claims.clear()
        for waiter in self._unclaimed_waiters.values():
            waiter.set()
        self._unclaimed_waiters.clear()
        if self._owns_storage and self._storage is not None:
            storage, self._storage = self._storage, None
            self._owns_storage = False
            self._inbox = None
            await storage.close()

    def _running(self, what: str) -> Storage:
        if not self._entered:
            raise AppNotRunningError(what)
        self.check_loop(what)
        return self.storage

    def check_loop(self, what: str) -> None:
        """Refuse a call made in another event loop than the one the app was entered in
        (another thread's, a test's own): it would run the app's work in the wrong loop."""
        loop = self._loop
        if loop is not None and asyncio.get_running_loop() is not loop:
            raise OtherEventLoopError(what, closed=loop.is_closed())

    async def _quietly(self, work: Callable[[], Awaitable[object]]) -> None:
        """Run ``work()`` in a task nobody waits for: a failure goes to ``on_error``. It is
        called here, not by whoever makes the task, so a task cancelled before it began
        leaves no coroutine unawaited."""
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.hooks.error(exc)

    # -- the public verbs ------------------------------------------------------------------

    # Typed from the function: its arguments are checked against its parameters after
    # ctx, and the handle's result is what it returns. A name gives a JSON value.
    @overload
    async def start(
        self,
        workflow: Callable[[Context, *Args], Awaitable[R]],
        *args: *Args,
        id: str | None = None,
        if_exists: IfExists = "raise",
        execution_timeout: float | timedelta | None = None,
    ) -> Handle[R]: ...
    @overload
    async def start(
        self,
        workflow: str,
        *args: object,
        id: str | None = None,
        if_exists: IfExists = "raise",
        execution_timeout: float | timedelta | None = None,
    ) -> Handle[JsonValue]: ...
    async def start(
        self,
        workflow: object,
        *args: object,
        id: str | None = None,
        if_exists: IfExists = "raise",
        execution_timeout: float | timedelta | None = None,
    ) -> Handle[Any]:
        """Start ``workflow(ctx, *args)`` as a new execution and drive it in this process.

        ``id`` defaults to a random one; a start onto an id that exists is refused with
        ExecutionAlreadyExistsError before the body runs, or, with ``if_exists="attach"``,
        returns a handle to that execution when it runs the same workflow (its arguments
        are not compared). The arguments must be JSON. ``execution_timeout`` (seconds or
        a timedelta) gives the execution a deadline, computed once from the app's clock:
        if it has not ended by then, a timer service cancels it, and its result raises
        ExecutionTimedOutError; the deadline goes on through ``ctx.continue_as_new``.
        """
        run = await self._begin_or_attach(
            "app.start", workflow, args, id, if_exists, execution_timeout
        )
        if isinstance(run, Handle):
            return run
        self._spawn(run)
        return Handle(self, run.execution_id)

    async def _begin_or_attach(
        self,
        what: str,
        workflow: object,
        args: tuple[object, ...],
        id: str | None,
        if_exists: IfExists,
        execution_timeout: object,
    ) -> Run | Handle[Any]:
        """:meth:`_begin`, or with ``if_exists="attach"`` the handle of the execution of
        the same workflow already at ``id``."""
        _check_if_exists(if_exists, id)
        try:
            return await self._begin(what, workflow, args, id, execution_timeout)
        except ExecutionAlreadyExistsError as refused:
            if if_exists == "raise":
                _explained(
                    refused,
                    f"{what}(..., if_exists='attach') "
                    f"{'returns its handle' if what == 'app.start' else 'waits for its result'}"
                    " instead, when it runs the same workflow; app.get(id) gives its handle",
                )
                raise
            return await self._attach(workflow, refused)

    async def _attach(self, workflow: object, refused: ExecutionAlreadyExistsError) -> Handle[Any]:
        """The handle ``if_exists="attach"`` gives for the execution a start found: one
        running the same function, under any name it is registered by."""
        name, fn = self._resolve(workflow)
        view = await self.inspect(refused.execution_id)
        if view.status is None:
            raise refused  # deleted since: a start again decides, not this one
        if view.workflow != name and self._workflows.get(view.workflow) is not fn:
            raise _explained(
                refused,
                f"it runs workflow {view.workflow!r}, not {name!r}: if_exists='attach' "
                "attaches only to an execution of the same workflow",
            )
        return Handle(self, refused.execution_id)

    @overload
    async def execute(
        self,
        workflow: Callable[[Context, *Args], Awaitable[R]],
        *args: *Args,
        id: str | None = None,
        if_exists: IfExists = "raise",
        execution_timeout: float | timedelta | None = None,
    ) -> R: ...
    @overload
    async def execute(
        self,
        workflow: str,
        *args: object,
        id: str | None = None,
        if_exists: IfExists = "raise",
        execution_timeout: float | timedelta | None = None,
    ) -> JsonValue: ...
    async def execute(
        self,
        workflow: object,
        *args: object,
        id: str | None = None,
        if_exists: IfExists = "raise",
        execution_timeout: float | timedelta | None = None,
    ) -> Any:
        """Start ``workflow(ctx, *args)`` as a new execution, drive it in the calling task
        and return its result: what ``start`` then ``result()`` do, without a task of its
        own, as calling a workflow function does in DBOS. With ``if_exists="attach"``, an
        execution of the workflow already at ``id`` is waited for instead, as ``start``
        attaches to it; ``execution_timeout`` is the execution's deadline, as for
        ``start`` (not a bound on this call's wait: wrap it in ``asyncio.timeout`` for that).

        The body runs in your task until it ends or parks; a parked execution is resumed
        as any other, and this waits for its result as :meth:`Handle.result` does (and
        raises what it raises). Cancelling the call (``asyncio.wait_for`` running out, for
        one) does not stop the execution: while the body runs, the app takes it over in a
        task of its own, under a fresh fence, as a restarted node would, and the
        cancellation goes on to you. Context variables the body sets are set in your task.
        """
        run = await self._begin_or_attach(
            "app.execute", workflow, args, id, if_exists, execution_timeout
        )
        if isinstance(run, Handle):
            return await run.result()
        if not self._entered:  # left while the start was written: the next start's
            raise AppNotRunningError("app.execute", left=True)
        execution_id = run.execution_id
        done = asyncio.get_running_loop().create_future()
        self._inline[done] = asyncio.current_task()
        try:
            last = await self._drive(run)
        except asyncio.CancelledError:
            self._take_back_later(execution_id, fence_first=False)
            raise
        finally:
            del self._inline[done]
            done.set_result(None)
        if not self._entered:
            raise AppNotRunningError("app.execute", left=True)
        if last is not None and last.kind == EventKind.EXECUTION_COMPLETED:
            return completion_result(last)
        try:
            return await Handle(self, execution_id).result()
        except AppNotRunningError as exc:
            if self._entered or isinstance(exc, OtherEventLoopError):
                raise
            # The caller called execute, not result(): say so (a request handler's log).
            raise AppNotRunningError("app.execute", left=True) from exc

    async def fork(
        self,
        execution_id: str,
        *,
        at: int | None = None,
        id: str | None = None,
        if_exists: IfExists = "raise",
        execution_timeout: float | timedelta | None = None,
        principal: object = None,
    ) -> Handle[JsonValue]:
        """Start a new execution of ``execution_id``'s workflow, with its input, that is
        served the recorded results of the body's durable calls before position ``at``
        (all it recorded, when ``at`` is None) and runs the rest with the current code,
        as DBOS's ``fork_workflow`` and a Temporal reset do: the way to run a failed or
        cancelled execution again from a chosen call once its bug is fixed.

        ``at`` is a position in the body's own line of calls, counted from 0 as
        ``app.inspect`` shows them: ``at=3`` takes what positions 0, 1 and 2 recorded,
        with every call under them (a ``ctx.gather`` branch's, numbered under the
        gather's position), and runs position 3 anew. The execution forked from may be in
        any state and is only read; messages sent to it stay in its inbox. The fork's id
        is ``id`` or a random one; with ``if_exists="attach"``, an id that holds a fork
        of the same execution at the same ``at`` (at any, with ``at`` left out: a
        running original records more calls meanwhile) gives that fork's handle (a
        retried call), and anything else there is refused. ``execution_timeout`` gives the fork a
        deadline of its own (the original's is not carried over). An ``authorize`` hook
        is asked first, on action ``"fork"`` of ``execution_id``; its refusal raises
        ActionDeniedError and is not recorded (the original is not written to).

        A fork's log is written in one append, so it copies at most
        ``MAX_EVENTS_PER_APPEND - 1`` (9,999) recorded calls; a larger one is refused
        with InvalidInputError, before anything is written.
        """
        self._running("app.fork")
        source = _check_id(execution_id)
        if at is not None and (not isinstance(at, int) or isinstance(at, bool) or at < 0):
            raise InvalidInputError(
                f"at= is the position of the first call the fork runs anew (an int >= 0), "
                f"or None to take every call {source!r} recorded, not {shown(at)}"
            )
        _check_if_exists(if_exists, id)
        new_id, deadline = self._new_execution("app.fork", id, execution_timeout)
        if not await self._allows(principal, "fork", source):
            raise ActionDeniedError(source, "fork", principal)
        view = await self.inspect(source)
        if view.status is None:
            raise ExecutionNotFoundError(source)
        fn = self._body_of(view)
        self.check_arguments(view.workflow, len(view.input), "app.fork")
        reach = max((position[0] + 1 for position in view.records), default=0)
        every_call = at is None
        # Kept as asked, for a retried call (see below); an at= no body reaches is kept
        # as the largest int every store and JSON reader takes.
        asked = None if at is None else min(at, _FARTHEST_AT)
        at = reach if at is None else min(at, reach)  # what it takes is what it records
        taken = sorted(
            (r for r in view.records.values() if r.position[0] < at),
            key=lambda r: r.sequence,
        )
        if len(taken) >= MAX_EVENTS_PER_APPEND:
            raise InvalidInputError(
                f"a fork of {source!r} at {at} would copy {len(taken)} recorded calls, and "
                f"a fork is written in one append of at most {MAX_EVENTS_PER_APPEND} "
                f"events (its start and {MAX_EVENTS_PER_APPEND - 1} calls): fork at an "
                "earlier position (a workflow this long is better kept short with "
                "ctx.continue_as_new); nothing was written"
            )
        await self.check_id_room(new_id)
        batch = [
            records.started(
                view.workflow,
                view.input,
                fingerprint=self._code_digest(view.workflow),
                node=self.node,
                root=new_id,
                deadline=deadline,
                forked_from=(source, at),
                fork_asked=asked if asked is not None and asked != at else None,
            ),
            *(
                records.copied(
                    r.position, r.call, r.name, r.value, r.error, r.attempt, r.site, r.topics
                )
                for r in taken
            ),
        ]
        try:
            token, written = await self._open(new_id, batch, deadline)
        except ExecutionAlreadyExistsError as refused:
            if if_exists == "raise":
                _explained(
                    refused,
                    "app.fork(..., if_exists='attach') returns the handle of the fork there "
                    "when the same call made it",
                )
                raise
            existing = await self.inspect(new_id)
            # Without at=, the call made before took every call recorded then, which may
            # be fewer than now (a running original goes on): any fork of it is that one.
            # An at= past the calls recorded then was kept as where they ended, which a
            # running original has since gone past: the fork keeps the at= it was asked.
            if existing.forked_from != source or (
                not every_call
                and existing.forked_at != at
                and await self._fork_asked(new_id) != asked
            ):
                _explained(
                    refused,
                    f"it is not a fork of {source!r}"
                    f"{'' if every_call else f' at {at}'}: if_exists='attach' attaches a "
                    "fork only to the fork the same call made before",
                )
                raise
            return Handle(self, new_id)
        self._spawn(Run(self, fold(written), token, fn))
        return Handle(self, new_id)

    async def _fork_asked(self, execution_id: str) -> int | None:
        """The ``at`` the call that made the fork ``execution_id`` passed, when it was past
        the calls recorded then (None otherwise, or in a log written before it was kept)."""
        first = await self.storage.events.read(execution_id, limit=1)
        payload = first[0].payload if first else None
        edge = payload.get("forked_from") if isinstance(payload, dict) else None
        asked = edge.get("asked") if isinstance(edge, dict) else None
        return asked if isinstance(asked, int) and not isinstance(asked, bool) else None

    async def _check_derived_ids(self, execution_id: str) -> None:
        """Refuse a long id whose inbox or successors' ids the store would refuse: a
        decorator may take room from every id (the tenant decorator's prefix), and an
        execution that could not receive or continue would be stuck, not refused."""
        longest = f"{INBOX_PREFIX}{execution_id}#{'9' * 20}"
        try:
            await self.storage.events.read(longest, limit=1)
        except InvalidExecutionIdError as exc:
            raise InvalidExecutionIdError(
                execution_id,
                f"{len(execution_id.encode('utf-8'))} bytes leave too little room for the "
                f"ids the runtime derives from it (its inbox's, {INBOX_PREFIX}<id>, and "
                f"its successors', <id>#<generation>: 32 bytes more) in this store: "
                f"{exc.reason}; use a shorter id",
            ) from None

    async def _begin(
        self,
        what: str,
        workflow: object,
        args: tuple[object, ...],
        id: str | None,
        execution_timeout: object = None,
    ) -> Run:
        """Write a new execution's EXECUTION_STARTED; the run that is to drive it."""
        self._running(what)
        name, fn = self._resolve(workflow)
        self.check_arguments(name, len(args), what)
        execution_id, deadline = self._new_execution(what, id, execution_timeout)
        if len(execution_id) > _PROBED_ID_LENGTH // 4:
            await self.check_id_room(execution_id)
        inputs = json_arguments(args, f"the input of workflow {name!r}")
        event = records.started(
            name,
            inputs,
            fingerprint=self._code_digest(name),
            node=self.node,
            root=execution_id,
            deadline=deadline,
        )
        token, written = await self._open(execution_id, [event], deadline)
        # What fold makes of that one event, made directly: this is every start's path.
        view = View(
            execution_id,
            head=1,
            status="running",
            workflow=name,
            input=inputs,
            fingerprint=self._code_digest(name),
            driven_by=self._code_digest(name),
            node=self.node,
            root=execution_id,
            fence=token,
            started_at=written[0].recorded_at,
            deadline=deadline,
        )
        return Run(self, view, token, fn)

    def _new_execution(
        self, what: str, id: str | None, execution_timeout: object
    ) -> tuple[str, datetime | None]:
        """A new execution's id (``id``, checked, or a random one) and its deadline; a
        long id is to be checked with :meth:`check_id_room` as well."""
        execution_id = uuid.uuid4().hex if id is None else _check_new_id(id)
        deadline = (
            None
            if execution_timeout is None
            else _deadline(execution_timeout, self.clock.now(), f"{what}'s execution_timeout=")
        )
        return execution_id, deadline

    async def check_id_room(self, execution_id: str) -> None:
        """Refuse (InvalidExecutionIdError) a new id longer than 256 bytes whose inbox's
        or successors' ids this store would refuse; shorter ones leave room under any
        decorator."""
        if len(execution_id) > _PROBED_ID_LENGTH // 4 and (
            len(execution_id.encode("utf-8")) > _PROBED_ID_LENGTH
        ):
            await self._check_derived_ids(execution_id)

    async def _open(
        self, execution_id: str, batch: Sequence[NewEvent], deadline: datetime | None
    ) -> tuple[int, tuple[Event, ...]]:
        """Create a new execution's log from ``batch``, and its deadline's timer row; the
        token the log was created under and what was written."""
        self._claim(execution_id)
        try:
            token, written = await self._create(execution_id, batch)
            if deadline is not None:
                # Under the claim, so no recovery takes the execution meanwhile; a
                # cancellation here is one after the write landed.
                await self._schedule_deadline(execution_id, deadline)
        except asyncio.CancelledError:
            # The write may land yet, unless another start's first write is in its place.
            self._take_back_later(execution_id, fence_first=True, settled=_exists)
            raise
        except WriteOutcomeUnknownError:
            # It may have landed, with no one to drive it; not once another start's first
            # write is in its place (a token would fence out that start's run).
            self._strand(execution_id, settled=_exists)
            raise
        finally:
            self._unclaim(execution_id)
        return token, written

    async def _schedule_deadline(self, execution_id: str, deadline: datetime) -> None:
        """Write the timer row of ``view``'s deadline (after its EXECUTION_STARTED, so a
        refused start writes nothing; every takeover and park writes it again, so one
        lost to a crash or a failed write here is put back by the next driver). A failure
        goes to ``on_storage_error``: the execution runs on, and its next park tries
        again."""
        try:
            await self.schedule_wake(TimerRecord(execution_id, deadline))
        except StoreClosedError:
            raise
        except LoomError as exc:
            self.hooks.storage_error(execution_id, exc)

    def _later(self, name: str, call: Callable[[], Awaitable[None]]) -> None:
        """Run ``call`` in a task of the app's own, reporting what it raises to on_error;
        none when the app is leaving."""
        if not self._entered:
            return
        task = asyncio.get_running_loop().create_task(self._quietly(call), name=name)
        self._driving.add(task)
        task.add_done_callback(self._driving.discard)

    def _take_back_later(
        self,
        execution_id: str,
        *,
        fence_first: bool,
        settled: Callable[[View], bool] | None = None,
    ) -> None:
        """A call was cancelled while a write of this process for ``execution_id`` may
        have been in flight (a start's first write, a resume's answer, a run's own write):
        take the execution back in a task of the app's own (left to the node's next start
        when the app is leaving). ``fence_first`` when the write may have left the log
        showing the execution not running yet (a first write, an answer, a cancel's end);
        ``settled``, when given, tells from the log that the write can no longer land
        (what it was to write, or another's write, is in its place), so no token is
        taken; see docs/design.md, "A cancelled call"."""
        if not self._entered or execution_id in self._taking_back:
            return
        self._taking_back.add(execution_id)
        take_back = functools.partial(
            self._take_back_or_strand, execution_id, fence_first, settled
        )
        task = asyncio.get_running_loop().create_task(
            self._quietly(take_back),
            name=f"loom:take-back:{execution_id}",
        )
        self._driving.add(task)
        task.add_done_callback(self._driving.discard)

    async def _take_back_or_strand(
        self,
        execution_id: str,
        fence_first: bool,
        settled: Callable[[View], bool] | None,
    ) -> None:
        """:meth:`_take_back`; when the store fails it, the execution is stranded, to be
        taken back in the same way once the store answers."""
        try:
            await self._take_back(execution_id, fence_first, settled=settled)
        except StoreClosedError:
            raise
        except StorageError as exc:
            self.hooks.storage_error(execution_id, exc)
            self._strand(execution_id, fence_first=fence_first, settled=settled)

    async def _take_back(
        self,
        execution_id: str,
        fence_first: bool,
        *,
        limited: bool = False,
        settled: Callable[[View], bool] | None = None,
    ) -> None:
        """Take a fresh token first (``fence_first``), so that whatever write of ours was
        in flight has landed or never will; then take the execution over as a restarted
        node would (an answer or a first write that landed leaves it running with no
        driver), and each successor it continued as meanwhile. A run cut in its body
        needs no token first: its log shows it running, and the takeover's own token
        settles its write. ``limited``: a node's recovery that a store failure cut short,
        made again: still a recovery, counted against ``max_recoveries``. ``settled``:
        whether a log shows the write in flight can no longer land (no token is needed
        then; one would fence out another node's run that put its own write there)."""
        try:
            await self._unclaimed(execution_id)
            events = self.storage.events
            token: int | None = None
            if (
                fence_first
                and not self._owned(execution_id)
                and "acquire_fence" in events.capabilities
                and (settled is None or not settled(await self.inspect(execution_id)))
            ):
                self._claim(execution_id)
                try:
                    token = await events.acquire_fence(execution_id)
                finally:
                    self._unclaim(execution_id)
            current: str | None = execution_id
            while current is not None:
                view = await self.inspect(current)
                if (
                    token is not None
                    and current == execution_id
                    and view.status == "running"
                    and view.node != self.node
                    and view.fence < token
                ):
                    # Another node answered the park (its timer service, a send of its
                    # own) before our token: that token has fenced its run out, so the
                    # execution is this process's to carry on.
                    await self._carry_on_fenced_out(current, older_than=token)
                else:
                    await self._recover_one(current, limited=limited)
                view = await self.inspect(current)
                current = view.successor if view.status == "continued" else None
            await self._report_landed(execution_id)
        finally:
            self._taking_back.discard(execution_id)

    async def schedule_wake(self, row: TimerRecord) -> None:
        """Write a timer row (``TimerStore.schedule``): the timer service looks at it when
        due even if it left it recently, and a clock that moves only when told (the test
        kit's) stops when it falls due."""
        await self.storage.timers.schedule(row)
        self.timer_service.forget_left(row)
        note = getattr(self.clock, "note_wake", None)
        if note is not None:
            note(row.wake_at)

    @property
    def timers_on(self) -> bool:
        """Whether the app runs its timer service while entered (``timers=``)."""
        return self._serve_timers

    @property
    def recovers_on_entry(self) -> bool:
        """Whether entering the app recovers its node's executions (``recover=``)."""
        return self._recover_on_enter

    @property
    def serves_timers(self) -> bool:
        """Whether this app is running its timer service (``timers=True``, entered)."""
        return self._serve_timers and self._entered

    @property
    def stranded(self) -> frozenset[str]:
        """Executions whose run in this process stopped because a store call failed, not
        carried on yet: the app retries in the background until the store answers."""
        return frozenset(e for e, strand in self._stranded.items() if strand.quiet_at is None)

    def _strand(
        self,
        execution_id: str,
        fruitless: int = 0,
        *,
        limited: bool = False,
        fence_first: bool = True,
        settled: Callable[[View], bool] | None = None,
    ) -> None:
        """A run of this process stopped because a store call failed (or a first write or
        an answer's outcome is unknown): the log may say it runs here with nothing driving
        it. Carry it on once the store answers again, as a restarted node would; see
        docs/design.md, "A failed store call". ``fruitless``: how many carry-ons in a row
        the run's log ends with (each waits twice as long as the one before);
        ``limited``: a node's recovery, cut short by the store, to be made again;
        ``fence_first`` and ``settled``: how a call cut short takes it back (see
        :meth:`_take_back`)."""
        if not self._entered:
            return  # leaving: the node's next start recovers it
        wait = min(CARRY_ON_AFTER * 2 ** min(fruitless, 16), CARRY_ON_CAP)
        self._keep_aside(
            execution_id,
            _Strand(self.clock.now() + self._jittered(wait), limited, fence_first, settled),
        )

    def _keep_aside(self, execution_id: str, strand: _Strand) -> None:
        """Carry ``execution_id`` on at ``strand.not_before``, in the carry-on task."""
        self._stranded[execution_id] = strand
        waking = self._carry_on_wakes
        if waking is not None and strand.not_before < waking and self._carrying_on is not None:
            # The carry-on sleeps past this one's turn (for an execution that keeps
            # failing): start it again, so this one is not held back by that one.
            self._carrying_on.cancel()
            self._carrying_on = self._carry_on_wakes = None
        self._carry_on_later()

    def _watch_quiet_rival(self, run: Run) -> None:
        """A run of this process was fenced out. Whoever took the token writes under it
        at once (a cancel its record, a resume its answer, a takeover its
        EXECUTION_RECOVERED); one that dies first leaves the execution running under this
        node with nothing driving it. Carry it on if the log still ends where the run
        left it after QUIET_RIVAL_AFTER seconds."""
        if not self._entered:
            return  # leaving: the node's next start recovers it
        execution_id = run.execution_id
        repeats = self._quiet_takeovers.get(execution_id, 0)
        wait = min(QUIET_RIVAL_AFTER * 2 ** min(repeats, 16), QUIET_RIVAL_CAP)
        not_before = self.clock.now() + timedelta(seconds=wait)
        self._keep_aside(execution_id, _Strand(not_before, quiet_at=run.final_view().head))

    async def _take_back_quiet(self, execution_id: str, head: int) -> None:
        """Carry on an execution a quiet rival fenced this process's run out of, if its
        log is still running at ``head``: nothing was written since the run stopped."""
        view = await self.inspect(execution_id)
        if view.status != "running" or view.head != head or self._owned(execution_id):
            return  # written since (cancelled, answered, taken over): theirs
        self._quiet_takeovers[execution_id] = self._quiet_takeovers.get(execution_id, 0) + 1
        await self._carry_on_fenced_out(execution_id)

    def _jittered(self, seconds: float) -> timedelta:
        """Between half and all of ``seconds``: executions one outage stopped do not all
        come back in the same instant."""
        return timedelta(seconds=seconds * (0.5 + self.random.random() / 2))

    def _carry_on_later(self) -> None:
        if self._carrying_on is None or self._carrying_on.done():
            self._carrying_on = asyncio.get_running_loop().create_task(
                self._carry_on(), name="loom:carry-on"
            )

    async def _carry_on(self) -> None:
        """Take back each stranded execution once its wait is over, and make the recovery
        on entering that could not list the executions, waiting longer each time the
        store fails."""
        delay = CARRY_ON_AFTER  # grows while the store keeps failing
        relist_at = self.clock.now() + self._jittered(delay)
        while self._stranded or self._relist:
            due = [strand.not_before for strand in self._stranded.values()]
            if self._relist:
                due.append(relist_at)
            wakes = min(due)
            pause = (wakes - self.clock.now()).total_seconds()
            if pause > 0:
                self._carry_on_wakes = wakes
                try:
                    await self.clock.sleep(pause)
                finally:
                    if self._carrying_on is asyncio.current_task():
                        self._carry_on_wakes = None
            now = self.clock.now()
            if self._relist and relist_at <= now:
                try:
                    # The recovery on entering, made again: what it cannot take over now,
                    # it strands.
                    await self._recover(left=self._driven_here)
                    self._driven_here = None
                    self._relisted()
                except StoreClosedError as exc:
                    self.hooks.error(exc)
                    self._relist = False
                    self._stranded.clear()
                    return
                except StorageError as exc:
                    self._relist_failed(exc)
                    delay = min(delay * 2, CARRY_ON_CAP)
                    relist_at = self.clock.now() + self._jittered(delay)
                    continue
                except Exception as exc:
                    self.hooks.error(exc)
                self._relist = False
            for execution_id, strand in list(self._stranded.items()):
                if strand.not_before > now or self._stranded.get(execution_id) is not strand:
                    continue  # not due yet, or stranded again meanwhile
                del self._stranded[execution_id]
                try:
                    if strand.quiet_at is not None:
                        await self._take_back_quiet(execution_id, strand.quiet_at)
                    else:
                        await self._take_back(
                            execution_id,
                            fence_first=strand.fence_first,
                            limited=strand.limited,
                            settled=strand.settled,
                        )
                except StoreClosedError as exc:
                    # The storage was closed under the app: nothing will answer again.
                    self.hooks.error(exc)
                    self._stranded.clear()
                    return
                except StorageError as exc:
                    self.hooks.storage_error(execution_id, exc)
                    delay = min(delay * 2, CARRY_ON_CAP)
                    later = self.clock.now() + self._jittered(delay)
                    self._stranded.setdefault(execution_id, replace(strand, not_before=later))
                    for other, waiting in list(self._stranded.items()):
                        if waiting.not_before < later:  # the store fails still: all wait
                            self._stranded[other] = replace(waiting, not_before=later)
                    break
                except Exception as exc:
                    self.hooks.error(exc)
            else:
                delay = CARRY_ON_AFTER

    def get(self, execution_id: str) -> Handle[JsonValue]:
        """A handle on an execution started anywhere."""
        return Handle(self, _check_id(execution_id))

    async def inspect(self, execution_id: str) -> View:
        """Fold the execution's log (``status`` is None when there is none)."""
        self.check_loop("app.inspect")
        storage = self.storage
        execution_id = _check_id(execution_id)
        return fold(await storage.events.read(execution_id), execution_id=execution_id)

    async def _look(self, execution_id: str) -> View:
        """:meth:`inspect`, for the timer service's fires: a long log's view is kept, and
        only what was appended since is folded (a park lists every wait still pending,
        so a gather of many sleeps writes a log whose fold grows as its square). The
        view is the runtime's own: it shares what the kept one holds, and no one outside
        gets it. Its last event, read again in full, tells whether the log is still the
        one kept (not deleted, nor made anew: a log made anew is written under newer
        tokens)."""
        events = self.storage.events
        known = self._views.get(execution_id)
        if known is not None:
            view, last = known
            tail = await events.read(execution_id, from_sequence=view.head - 1)
            if tail and tail[0] == last:
                if len(tail) > 1:
                    view, last = fold(tail[1:], into=view), tail[-1]
                if view.terminal:  # nothing wakes it again: not kept
                    self._forget_ended(execution_id)
                    return view
                self._keep_view(view, last)
                return fold((), into=view)  # its containers the caller's own
            self._views.pop(execution_id, None)
        log = await events.read(execution_id)
        view = fold(log, execution_id=execution_id)
        if view.terminal:
            self._forget_ended(execution_id)  # what a look that raced its end kept
        elif len(log) + len(view.waits) >= _KEPT_FROM:
            self._keep_view(view, log[-1], anew=True)
            return fold((), into=view)
        return view

    def _forget_ended(self, execution_id: str) -> None:
        """The execution ended: its kept view (every step's result of a long log) and
        the messages read of its inbox go now, rather than when 1024 later ones have
        pushed them out; a worker would otherwise hold the last 1024 of each, finished,
        for good."""
        if self._views:
            self._views.pop(execution_id, None)
        if self._inbox is not None:
            self._inbox.forget(execution_id)

    def _keep_view(self, view: View, last: Event, *, anew: bool = False) -> None:
        """Keep ``view`` for the next look; one folded from the log read whole (``anew``)
        replaces what was kept, one from a tail only a view it goes beyond (a look that
        read later may have kept a later one meanwhile)."""
        kept = self._views.get(view.execution_id)
        if not anew and kept is not None and kept[0].head > view.head:
            return
        self._views[view.execution_id] = (view, last)
        self._views.move_to_end(view.execution_id)
        while len(self._views) > _KEPT_VIEWS:
            self._views.popitem(last=False)

    async def get_event(
        self,
        execution_id: str,
        key: str,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the API, as Handle.result's)
    ) -> JsonValue:
        """The latest value the execution published under ``key`` with ``ctx.set_event``
        (following continue-as-new: a successor's replaces its predecessor's), waiting
        for one while the execution runs. None when it ended without one, or when
        ``timeout`` seconds passed first; ExecutionNotFoundError when there is no such
        execution; AppNotRunningError when the app is left while it waits."""
        self._running("app.get_event")
        execution_id = _check_id(execution_id)
        key = check_text(key, "an event key")
        timeout = _check_timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        found: Recorded | None = None
        current = execution_id
        interval = 0.01
        while True:
            changed = self.watch(current)
            try:
                view = await self.inspect(current)
            except BaseException as exc:
                self.unwatch(current, changed)
                if not self._entered and isinstance(exc, StoreClosedError | AppNotRunningError):
                    # Left while it waited: its storage closed, under the read or before.
                    raise AppNotRunningError("app.get_event", left=True) from exc
                raise
            latest: Recorded | None = None
            for recorded in view.records.values():
                if recorded.call == "event" and recorded.name == key and (
                    latest is None or recorded.sequence > latest.sequence
                ):
                    latest = recorded
            if latest is not None:
                found = latest  # a successor's replaces its predecessor's
            remaining = _remaining(loop, deadline)
            if view.status is None or view.terminal or found is not None or (
                remaining is not None and remaining <= 0
            ):
                self.unwatch(current, changed)
                if view.status is None and current == execution_id:
                    raise ExecutionNotFoundError(execution_id)
                if view.status == "continued" and view.successor is not None:
                    current = view.successor
                    continue
                return None if found is None else fresh(found.value)
            if not self._entered:
                # Left while it waited: on a storage the caller opened, it would read on
                # for ever, with nothing of this process driving the execution.
                self.unwatch(current, changed)
                raise AppNotRunningError("app.get_event", left=True)
            wait = interval if remaining is None else min(interval, remaining)
            await self.wait_changed(current, wait, changed)  # unwatches it
            interval = min(interval * 2, 1.0)

    def executions(
        self,
        *,
        status: Status | Collection[Status] | None = None,
        workflow: object = None,
    ) -> AsyncIterator[View]:
        """Each execution in the store, folded, in id order: those with ``status`` (one or
        a collection of them) running ``workflow`` (a registered workflow, under any name
        it is registered by, or one name), every one when both are None. Each generation
        of a continue-as-new chain is an execution of its own (``view.root`` names the
        first, ``view.generation`` counts).

        It reads every log, one after another: a listing for a person or a script, not a
        call for every request. An execution whose log cannot be read (a shredded subject,
        a log the runtime did not write) goes to ``on_error`` and is left out; a store
        that fails is raised, and the listing can start again after the last id it gave.
        """
        self._running("app.executions")
        wanted = _statuses(status)
        names: frozenset[str] | None
        if workflow is None:
            names = None
        elif isinstance(workflow, str):
            names = frozenset((check_text(workflow, "a workflow name"),))
        elif callable(workflow):
            names = self._names_of(self._resolve(workflow)[1])
        else:
            raise InvalidInputError(
                f"workflow= takes a registered workflow or a workflow's name, not {workflow!r}"
            )
        return self._executions(wanted, names)

    def _names_of(self, fn: Callable[..., Awaitable[Any]]) -> frozenset[str]:
        """Every name ``fn`` is registered under (an old name kept beside a new one for
        the executions started under it)."""
        return frozenset(name for name, body in self._workflows.items() if body is fn)

    async def _executions(
        self, wanted: frozenset[str] | None, names: frozenset[str] | None
    ) -> AsyncIterator[View]:
        after: str | None = None
        while ids := await self._running("app.executions").events.list_executions(
            after=after, limit=100
        ):
            after = ids[-1]
            for execution_id in ids:
                if execution_id.startswith("$"):
                    continue  # the runtime's own streams (an inbox), never an execution
                self._running("app.executions")  # left meanwhile: the listing ends
                try:
                    view = await self.inspect(execution_id)
                except StorageError:
                    raise
                except LoomError as exc:
                    self.hooks.error(exc)
                    continue
                if view.status is None or view.started_at is None:
                    continue  # a stream of events the runtime did not start
                if wanted is not None and view.status not in wanted:
                    continue
                if names is not None and view.workflow not in names:
                    continue
                yield view

    async def send(
        self,
        execution_id: str,
        topic: str,
        value: object = None,
        *,
        key: str | None = None,
    ) -> int:
        """Store a message for ``execution_id`` durably, then wake it if it waits on
        ``topic``; returns the message's id. With ``key`` a repeated send is a no-op
        returning the first message's id. A message for an execution that continued as
        new goes on to its successor; one whose workflow this app does not register is
        left to a node that does (see docs/runtime.md, "Messages")."""
        storage = self._running("app.send")
        execution_id = _check_id(execution_id)
        topic = check_text(topic, "a topic")
        if key is not None and (not isinstance(key, str) or not key or key[0] == "$"):
            raise InvalidInputError(
                f"key= must be a non-empty str not starting with '$' (those are the keys "
                f"of the messages Loom hands on), or None, not {key!r}"
            )
        if key is not None:
            key = check_text(key, "key=")
        payload = json_value(value, f"the message on {topic!r}")
        # Its first event, not only its head: a log that cannot be read (its payloads
        # shredded, say) refuses the send here, before the message is stored.
        if not await storage.events.read(execution_id, limit=1):
            raise ExecutionNotFoundError(execution_id)
        # Delivered, or left to its wake row; or the receiver finished, and if it continued
        # as new, the delivery handed the message on to its successor (see _deliver). A
        # log deleted since it was found refuses the send (see _post).
        sent: list[Message] = []
        try:
            stored, _ = await self._post(
                execution_id, [(topic, payload, key)], sending=True, sent=sent
            )
        except StoreClosedError:
            if not sent:
                raise
            # Closed under the delivery (the app left, say): the message is stored and its
            # wake row due, so the next start delivers it. Raising would have the caller
            # send it again, twice without a key.
            return sent[0].sequence
        return stored[0].sequence

    async def _post(
        self,
        execution_id: str,
        messages: Sequence[_Outgoing],
        *,
        sending: bool = False,
        sent: list[Message] | None = None,
    ) -> tuple[list[Message], Fired]:
        """Store ``messages`` (topic, value, key) in order, then wake the receiver; what
        was stored and how its wake went. When the receiver continued as new, what it left
        goes on to its successor, and so on down the chain: in a loop here, not a call per
        generation, since a chain can be thousands of generations long.

        A receiver whose log the delivery finds deleted (pruned after the sender found it)
        has its inbox, which the message may have made anew, deleted again, and, for
        ``sending`` (app.send's own receiver), ExecutionNotFoundError is raised: the
        message reaches no one. ``sent`` gets the messages of the first hop once they are
        stored, for a caller to tell them stored when what follows fails."""
        result: tuple[list[Message], Fired] | None = None
        behind: TimerRecord | None = None  # the row of the hop before, until this one holds
        while True:
            # The wake row comes first: a sender that dies after storing the message leaves
            # a due row behind, and the timer service delivers what it finds.
            wake = TimerRecord(execution_id, self.clock.now())
            stored: list[Message] = []
            claimed: list[TimerRecord] = []  # its own rows, when another's named its instant
            claim = functools.partial(self._claim_row, claimed, execution_id)
            try:
                await self.schedule_wake(wake)
                for m in messages:
                    at = claimed[-1].wake_at if claimed else wake.wake_at
                    claiming = None if stored else claim
                    stored.append(
                        await self.inbox.put(execution_id, *m, wake_at=at, claim=claiming)
                    )
            except LoomError as exc:
                if result is not None and not isinstance(exc, StoreClosedError):
                    # A hop down the chain: the sender's message is stored, and the row
                    # behind stays due, for the timer service to hand it on again.
                    if isinstance(exc, StorageError):
                        self.hooks.storage_error(execution_id, exc)
                    else:
                        self.hooks.error(exc)
                    return result
                if not stored and not isinstance(exc, WriteOutcomeUnknownError):
                    # Refused, nothing stored: the rows would wake the receiver for nothing
                    # (and the refusal leaves the store as it was).
                    with contextlib.suppress(LoomError):
                        for row in (wake, *claimed):
                            await self.storage.timers.complete(row.execution_id, row.wake_at)
                raise
            if result is None and sent is not None:
                sent.extend(stored)
            first_row = wake
            if claimed:
                wake = claimed[-1]
            if behind is not None:
                await self._retire_row(behind)  # what it woke for is onward now
                behind = None
            onward: list[_Hop] = []
            try:
                outcome = await self._deliver_stored(wake, onward)
            except ExecutionNotFoundError:
                await self._drop_orphan(execution_id, {first_row, *claimed})
                if result is None and sending:
                    raise
                return result if result is not None else (stored, "obsolete")
            if result is None:
                result = (stored, outcome)
            if onward:
                behind = wake
                execution_id, messages = onward[0]
                continue
            if outcome != "left":
                await self._retire_row(wake)
            else:
                # A timer service that fired the row before the message was stored found
                # nothing to answer and retired it: write it again, now that it has one.
                try:
                    await self.schedule_wake(wake)
                except StoreClosedError:
                    raise
                except StorageError as exc:
                    self.hooks.storage_error(execution_id, exc)  # the row is due still
            return result

    async def _drop_orphan(self, execution_id: str, rows: Set[TimerRecord]) -> None:
        """Delete the inbox a sender stored into after ``execution_id``'s log was deleted,
        and ``rows`` (the sender's): a prune that deleted the inbox before the message was
        stored would otherwise leave it for a new execution of that id to receive. Left
        when the log was made anew meanwhile (the inbox is that execution's), or when the
        store fails (a row left due finds the log gone, and comes here again)."""
        events = self.storage.events
        with contextlib.suppress(LoomError):
            if await events.head(execution_id) == 0:
                await events.delete_execution(inbox_of(execution_id))
                self.inbox.forget(execution_id)
            for row in rows:
                await self.storage.timers.complete(row.execution_id, row.wake_at)

    async def _claim_row(
        self, claimed: list[TimerRecord], execution_id: str, wake_at: datetime
    ) -> None:
        """Write a sender's wake row at ``wake_at``, the instant it takes when another
        sender's message names the one it first wrote (see Inbox.put)."""
        claimed.append(TimerRecord(execution_id, wake_at))
        await self.schedule_wake(claimed[-1])

    async def _deliver_stored(
        self,
        wake: TimerRecord,
        onward: list[_Hop],
    ) -> Fired:
        """Deliver what a sender has stored. Raising from here on would tell it the send
        failed (a send without a key, sent again, would be stored twice): when the
        delivery cannot be made now the row stays due, and the timer service delivers,
        backing off while rivals hold the fence, on a node that has the workflow when this
        app does not (a sender beside the workers; it is refused before any token is
        taken), or once the store answers again (an answer whose outcome was lost is
        carried on by the app). So is an app left meanwhile: its next start delivers (an
        answer that landed as it was left is carried on by that start's recovery). So is
        a log this runtime cannot read (a kind a newer one wrote): the message waits in
        the inbox for a node that can, and the timer service reports the log."""
        if not self._entered:
            return "left"
        try:
            return await self._deliver(wake, onward=onward)
        except (
            ResumeContendedError,
            WorkflowNotFoundError,
            ReplayDivergedError,
            AppNotRunningError,
            LogFormatError,
        ):
            return "left"
        except StoreClosedError:
            raise
        except StorageError as exc:
            self.hooks.storage_error(wake.execution_id, exc)
            return "left"

    async def _retire_row(self, row: TimerRecord) -> None:
        """Remove a wake row that has done its work; one the store fails to remove stays
        due, and the timer service finds it obsolete."""
        try:
            await self.storage.timers.complete(row.execution_id, row.wake_at)
        except StoreClosedError:
            raise
        except StorageError as exc:
            self.hooks.storage_error(row.execution_id, exc)

    def _left_behind(
        self, view: View, messages: Sequence[Message]
    ) -> _Hop | None:
        """What ``view``'s execution, which continued as new, left unconsumed among
        ``messages`` (its inbox), each keyed by the message, for its successor; None when
        it left nothing."""
        if view.status != "continued" or view.successor is None:
            return None
        left: list[_Outgoing] = [
            (m.topic, m.value, f"$from:{view.execution_id}:{m.sequence}")
            for m in messages
            if m.sequence not in view.consumed
        ]
        return (view.successor, left) if left else None

    async def _hand_on(self, view: View, *, wake: bool) -> None:
        """Hand what ``view``'s execution left unconsumed in its inbox, if it continued as
        new, to its successor, in the order it was sent, each once, and so on down the
        chain. Whoever may find a message left does this after storing or finding it: the
        run that continued (after recording it), a recovery of the successor, a wake row
        of the execution that continued (its sender's, who may have died before handing
        the message on, or the delivery of a sender who finds the receiver continued).
        Each hands on every message left, oldest first, under a key naming the message,
        so the order holds and a message handed on twice is stored once. Down the chain:
        the successor's own delivery hands on again if it continued too."""
        if view.status != "continued" or view.successor is None:
            return
        hop = self._left_behind(view, await self.inbox.messages(view.execution_id))
        if hop is None:
            return
        successor, left = hop
        if not wake:
            # No run of the successor has started yet: its receives read the inbox.
            for message in left:
                await self.inbox.put(successor, *message)
            return
        await self._post(successor, left)

    async def resume(
        self, execution_id: str, *, fence_if_parked_at: int, principal: object = None
    ) -> None:
        """Answer the park at sequence ``fence_if_parked_at`` now, through the conditional
        fence, and drive the body on in this process.

        The answer is a waiting message if one is there, else the earliest timer of the
        park (woken early if it is not due). Raises ResumeRefusedError (not-suspended,
        nothing-to-answer), ResumeContendedError (retry later) or, with nothing written,
        ReplayDivergedError (the app's code no longer matches the log); see
        docs/runtime.md.
        """
        self._running("app.resume")
        execution_id = _check_id(execution_id)
        if (
            not isinstance(fence_if_parked_at, int)
            or isinstance(fence_if_parked_at, bool)
            or fence_if_parked_at < 0
        ):
            raise InvalidInputError(
                f"fence_if_parked_at must be the park's sequence (an int >= 0), not "
                f"{fence_if_parked_at!r}"
            )
        # Asked first, so a refused caller learns nothing of the execution, and before any
        # token is taken (docs/design.md, "Resuming a park").
        allowed = await self._allows(principal, "resume", execution_id)
        view = await self.inspect(execution_id)
        if not allowed:
            if view.status is not None and not view.terminal:
                await self._record_denial(principal, "resume", view)
            raise ActionDeniedError(execution_id, "resume", principal)
        _, run = await self._answer(view, fence_if_parked_at, force=True)
        self._spawn(run)

    async def cancel(
        self, execution_id: str, *, reason: str | None = None, principal: object = None
    ) -> bool:
        """Cancel the execution: a parked one through the fence, a running one by fencing
        its driver out (it stops at its next durable call); one that continued as new, its
        live successor. False if it had finished."""
        self._running("app.cancel")
        execution_id = _check_id(execution_id)
        if reason is not None and not isinstance(reason, str):
            raise InvalidInputError(f"reason= must be a str or None, not {reason!r}")
        if reason:
            # Checked before any token is taken: a reason no store can hold must not
            # fence out the run it was meant to stop.
            reason = check_text(reason, "reason=")
        # Asked first, so a refused caller learns nothing of the execution.
        allowed = await self._allows(principal, "cancel", execution_id)
        view = await self.inspect(execution_id)
        if view.status is None:
            if not allowed:
                raise ActionDeniedError(execution_id, "cancel", principal)
            raise ExecutionNotFoundError(execution_id)
        while True:
            while view.status == "continued" and view.successor is not None:
                view = await self.inspect(view.successor)
            if not allowed:
                if not view.terminal:
                    await self._record_denial(principal, "cancel", view)
                raise ActionDeniedError(execution_id, "cancel", principal)
            if view.terminal:
                return False
            if await self._cancel(view, reason):
                return True
            view = await self.inspect(view.execution_id)  # finished meanwhile: continued?
            if view.status is None:
                raise ExecutionNotFoundError(view.execution_id)  # deleted meanwhile

    async def _cancel(self, view: View, reason: str | None, *, timed_out: bool = False) -> bool:
        """Append EXECUTION_CANCELLED to the execution ``view`` shows unfinished (see
        :meth:`cancel`); False if it finished meanwhile. ``timed_out``: its deadline
        passed."""
        events = self.storage.events
        execution_id = view.execution_id
        cancel_event = records.cancelled(reason, self.node, timed_out=timed_out)
        self.hooks.event(execution_id, cancel_event)
        if view.park is not None:
            try:
                written = (
                    await answer_park(
                        events, view, view.park.sequence, _constant([cancel_event]),
                        lost=functools.partial(self.lost_reply, execution_id),
                    )
                )[2]
            except LoomError:
                view = await self.inspect(execution_id)  # answered or contended: fence it
                if await self._report_landed(execution_id):
                    await self._cancelled(execution_id)  # its reply was lost, not its write
                    return True
            else:
                self._reported(written)
                await self._cancelled(execution_id)
                return True
        if not await self._append_end(view, cancel_event):
            return False
        await self._cancelled(execution_id)
        return True

    async def _append_end(self, view: View, event: NewEvent) -> bool:
        """Append ``event`` (a terminal kind) to ``view``'s execution under a newly acquired
        token, which fences out whatever drives it; False if it ended meanwhile."""
        events = self.storage.events
        execution_id = view.execution_id
        if view.status is None:
            return False  # deleted: there is nothing to end, and no token to take
        fencing = "acquire_fence" in events.capabilities
        token: int | None = None
        try:
            token = await events.acquire_fence(execution_id) if fencing else view.fence
            view = await read_tail(events, view)
            while True:
                if view.terminal:
                    return False
                try:
                    written = await events.append(
                        execution_id, [event], expected_sequence=view.head, fence=token
                    )
                except SequenceConflictError:
                    moved = await tail_past_conflict(events, view)
                    if moved is None:
                        return False  # deleted under us: nothing left to end
                    view = moved
                    continue
                except StaleFenceError:
                    if not fencing:
                        raise
                    token = await events.acquire_fence(execution_id)
                    view = await read_tail(events, view)
                    continue
                break
        except asyncio.CancelledError:
            if fencing:  # a token may have fenced out the run, and the end may land yet
                self._later(
                    f"loom:carry-on:{execution_id}",
                    functools.partial(self._end_cut_short, execution_id),
                )
            raise
        except StorageError as exc:
            if isinstance(exc, WriteOutcomeUnknownError) and token is not None:
                self.lost_reply(execution_id, view.head, token, [event])
            if fencing and not isinstance(exc, StoreClosedError) and (
                token is not None or isinstance(exc, WriteOutcomeUnknownError)
            ):
                self._later(
                    f"loom:carry-on:{execution_id}",
                    functools.partial(self._end_cut_short, execution_id),
                )
            raise
        self._reported(written)
        self._forget_ended(execution_id)
        run = self._drivers.get(execution_id)
        if run is not None:
            # This process's run stops now, not at its next write: a step waiting to try
            # again does not (a run elsewhere finds the cancel between attempts).
            run.stop()
        elif self._owned(execution_id):
            # A write of this process is about to spawn its run (a start, an answer, a
            # continuation whose reply had not come back): under its stale token the body
            # would still run its next step, for an execution already ended.
            self._ended_unspawned.add(execution_id)
        # Whoever waits for its result hears now, not when a step in flight returns.
        winding_down = self._runs.get(execution_id)
        if winding_down is not None:
            self._ended[execution_id] = (winding_down, written[-1])
        for end in self._ends.pop(execution_id, ()):
            if not end.done():
                end.set_result(written[-1])
        return True

    async def _give_up(self, view: View) -> None:
        """Fail an execution its recoveries never got further (see ``max_recoveries``),
        and tell ``on_error``."""
        refused = RecoveryLimitError(view.execution_id, view.recoveries)
        failure = records.failed(type_name(refused), str(refused))
        self.hooks.event(view.execution_id, failure)
        if await self._append_end(view, failure):
            self.hooks.error(refused)  # before the rows go: a failure there is not this
            await self._cancelled(view.execution_id)

    async def _recover_on_entering(self) -> None:
        """:meth:`recover`, made again in the background (after 1 s, then up to every
        30 s) while the store fails to list the executions: a shard that is down, say."""
        try:
            await self._recover(left=self._driven_here)
        except StoreClosedError:
            raise
        except StorageError as exc:
            self._relist_failed(exc)
            self._relist = True
            self._carry_on_later()
        else:
            self._driven_here = None

    def _relist_failed(self, exc: StorageError) -> None:
        """A listing of the recovery on entering failed: the first of a run of them goes
        to ``on_error``, and one that fails with another type of error; the others to
        DEBUG (see :meth:`_relisted`)."""
        self._relist_failures += 1
        if type(exc) is not self._relist_failing:
            self._relist_failing = type(exc)
            self.hooks.error(exc)
        else:
            _log.debug("the recovery on entering failed again to list the executions: %s", exc)

    def _relisted(self) -> None:
        """The recovery on entering listed the executions: an outage it met is over."""
        if self._relist_failures:
            _log.info(
                "the recovery on entering lists the executions again, after %d failed "
                "listings in a row", self._relist_failures,
            )
        self._relist_failing = None
        self._relist_failures = 0

    async def recover(self) -> list[Handle[JsonValue]]:
        """Re-drive every execution this node was running when it last stopped: take a
        fresh fence (anything left of the previous process is fenced out), record
        EXECUTION_RECOVERED, and replay. Returns a handle per execution taken over.

        One execution that cannot be taken over does not stop the others: a store call
        that failed for it goes to ``on_storage_error`` and it is carried on once the
        store answers (it is in :attr:`stranded` meanwhile); any other refusal (its log
        cannot be read, its payloads shredded) goes to ``on_error``, and it is left.
        A failure to list the executions is raised."""
        return await self._recover()

    async def _recover(self, *, left: Set[str] | None = None) -> list[Handle[JsonValue]]:
        """:meth:`recover`, leaving the executions in ``left``."""
        storage = self._running("app.recover")
        events = storage.events
        handles: list[Handle[JsonValue]] = []
        after: str | None = None
        while True:
            ids = await events.list_executions(after=after, limit=100)
            if not ids:
                return handles
            after = ids[-1]
            for execution_id in ids:
                if execution_id.startswith("$") or (left is not None and execution_id in left):
                    continue
                try:
                    handle = await self._recover_one(execution_id)
                except StoreClosedError:
                    raise
                except StorageError as exc:
                    self.hooks.storage_error(execution_id, exc)
                    self._strand(execution_id, limited=True)
                    continue
                except LoomError as exc:
                    self.hooks.error(exc)
                    continue
                if handle is not None:
                    handles.append(handle)

    async def _recover_one(
        self, execution_id: str, *, limited: bool = True
    ) -> Handle[JsonValue] | None:
        """Take ``execution_id`` over when its log says it runs under this node and no run
        of this process drives it or is about to (see :meth:`_owned`). ``limited``: a
        node's recovery, which fails instead an execution that the same code recovered
        ``max_recoveries`` times in a row without its run writing anything; a process
        carrying on its own runs after a store failure has no limit."""
        if isinstance(self.halted.get(execution_id), ReplayDivergedError):
            return None  # this process's code diverged from its log: it would again
        view = await self._unowned_view(execution_id)
        if view is None:
            return None
        self._claim(execution_id)
        try:
            fn = self._body_of(view)
            if limited:
                limit = self._max_recoveries.get(view.workflow)
                if (
                    limit is not None
                    and view.recoveries >= limit
                    and view.recovered_by == self._code_digest(view.workflow)
                ):
                    await self._give_up(view)
                    return None
            taken = await self._take_over(view, carried_on=not limited)
            if taken is not None and view.continued_from is not None:
                # The run that continued may have died before handing on its messages.
                await self._hand_on(await self.inspect(view.continued_from), wake=False)
        except WorkflowNotFoundError as exc:
            self.hooks.error(exc)
            return None
        except StaleFenceError:
            return None  # someone took it after us; theirs now
        finally:
            self._unclaim(execution_id)
        if taken is None:
            return None
        token, view = taken
        self._spawn(Run(self, view, token, fn))
        return Handle(self, execution_id)

    @property
    def driving(self) -> frozenset[str]:
        """The executions this process is driving right now."""
        return frozenset(self._runs)

    async def drain(self) -> None:
        """Wait until this process drives nothing (the recovery on entering has taken over
        what it found, every local run finished or parked, and no parked run is answering
        its own park to drive on); an ``execute`` in the task that drains is not waited
        for. Scheduled workflows due meanwhile are started once it returns."""
        self.check_loop("app.drain")
        self._draining += 1
        self._undrained.clear()
        try:
            await self._drain()
        finally:
            self._draining -= 1
            if not self._draining:
                self._undrained.set()

    async def undrained(self) -> None:
        """Return once no :meth:`drain` is waiting (the scheduler waits here)."""
        if self._draining:
            await self._undrained.wait()

    @property
    def draining(self) -> bool:
        """Whether a :meth:`drain` is waiting."""
        return bool(self._draining)

    @property
    def running(self) -> bool:
        """Whether the app has been entered and not left."""
        return self._entered

    async def _drain(self) -> None:
        while True:
            here = asyncio.current_task()
            others = [done for done, task in self._inline.items() if task is not here]
            recovering = self._recovering
            if recovering is not None and recovering.done():
                recovering = self._recovering = None
            waiting = [*self._driving, *others, *([recovering] if recovering else [])]
            if not waiting:
                return
            if all(task.done() for task in waiting):
                # Ended, and taken out of these by their done callbacks at the loop's next
                # turn: give it one. (gather() of futures that are all done returns without
                # yielding from Python 3.12 on, so waiting there would spin for ever.)
                await asyncio.sleep(0)
                continue
            await asyncio.gather(*waiting, return_exceptions=True)

    def busy(self) -> list[asyncio.Task[Any]]:
        """The tasks of this app making progress: a run that is not finished or parked,
        unless every branch of it waits out a retry's interval on the app's clock; a run
        about to begin or settling its end; the recovery on entering. What the test kit's
        virtual clock waits for before it moves on."""
        busy: list[asyncio.Task[Any]] = []
        driving_runs = set()
        for execution_id, task in self._runs.items():
            driving_runs.add(task)
            run = self._drivers.get(execution_id)
            if run is None or not run.settled:
                busy.append(task)
        busy.extend(t for t in self._driving if t not in driving_runs and not t.done())
        if self._recovering is not None and not self._recovering.done():
            busy.append(self._recovering)
        busy.extend(self.scheduler.busy())
        return busy

    # -- what the driver and the timer service call ------------------------------------------

    def _why_not_moving(self, view: View) -> str:
        """What a test whose wait for ``view``'s execution ran out may have left undone, for
        the error it gets ("" when nothing points to it)."""
        execution_id = view.execution_id
        if (
            view.status == "suspended"
            and getattr(self.clock, "tick", None) is not None  # moves only when told
            and view.park is not None
            and (view.deadline is not None or any(w.wake_at for w in view.park.waits))
        ):
            return (
                "it waits for a time on the app's clock, which moves only when told: await "
                "clock.advance(...) first, or from a task of its own"
            )
        if (
            view.status == "running"
            and self.crash_points
            and execution_id not in self._runs
            and execution_id not in self._stranded
        ):
            return (
                "no run of this process drives it, as after a crash point (crash_at) "
                "stopped it: await app.recover() carries it on, as a restarted process would"
            )
        return ""

    def crash_point(self, run: Run, position: Position, name: str, when: str) -> bool:
        if not any(point(run.execution_id, position, name, when) for point in self.crash_points):
            return False
        # The run is dead from here on, as a killed process is: nothing drives it any more.
        if self._drivers.get(run.execution_id) is run:
            del self._drivers[run.execution_id]
            self._runs.pop(run.execution_id, None)
        return True

    async def _local_end(self, execution_id: str, seconds: float | None) -> Event | None:
        """While a run in this process drives ``execution_id``, wait for it (at most
        ``seconds``, then None) and for whatever run it hands the execution on to
        (a resume of its own park, a continued execution's first run). The finished view
        when such a run ends the execution; None when none drives it, or it ends otherwise
        (parked, stopped), and the log is to be read."""
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while execution_id in self._runs:
            ended_here = self._ended.get(execution_id)
            if ended_here is not None and ended_here[0] is self._runs.get(execution_id):
                return ended_here[1]  # a cancel of this process ended it; its run winds down
            left = _remaining(loop, deadline)
            if left is not None and left <= 0:
                return None
            end: asyncio.Future[Event | None] = loop.create_future()
            self._ends.setdefault(execution_id, []).append(end)
            if self._look_timer is None:
                self._look_timer = loop.call_later(_LOCAL_LOOK, self._look_again)
            try:
                if left is None:
                    ended = await end
                else:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns an
                    # end that came in the turn the caller was cancelled, and the
                    # cancellation is lost.
                    async with asyncio.timeout(left):
                        ended = await end
            except TimeoutError:
                return None
            finally:
                waiting = self._ends.get(execution_id)
                if waiting is not None and end in waiting:
                    waiting.remove(end)
                    if not waiting:
                        del self._ends[execution_id]
                looked = end in self._looked
                self._looked.discard(end)
            if looked:
                return None  # a second has passed: the log is to be read
            if ended is not None:
                return ended
        return None

    def _look_again(self) -> None:
        """Once a second while someone waits for a run of this process: wake each waiter
        to read the log (another process's cancel fences the run out, and the run hears
        of that only at its next write, which a step in flight can hold back for ever).
        One timer for the app, armed by the first waiter, rather than one per wait."""
        self._look_timer = None
        for ends in self._ends.values():
            for end in ends:
                if not end.done():
                    self._looked.add(end)
                    end.set_result(None)

    def changed(self, execution_id: str) -> None:
        waiting = self._signals.pop(execution_id, None)
        if waiting is not None:
            for signal in waiting:
                signal.set()

    def watch(self, execution_id: str) -> asyncio.Event:
        """An event the next write of a run in this process to ``execution_id`` sets;
        :meth:`wait_changed` on it, or :meth:`unwatch` it when not waiting after all."""
        signal = asyncio.Event()
        waiting = self._signals.get(execution_id)
        if waiting is None:
            self._signals[execution_id] = [signal]
        else:
            waiting.append(signal)
        return signal

    def unwatch(self, execution_id: str, signal: asyncio.Event) -> None:
        """Forget ``signal`` (set meanwhile, it is forgotten already)."""
        waiting = self._signals.get(execution_id)
        if waiting is None:
            return
        with contextlib.suppress(ValueError):
            waiting.remove(signal)
        if not waiting:
            del self._signals[execution_id]

    async def wait_changed(
        self, execution_id: str, seconds: float, signal: asyncio.Event | None = None
    ) -> None:
        """Wait until a run in this process writes to ``execution_id``, or ``seconds``;
        pass the :meth:`watch` event taken before reading, so no write is missed."""
        if signal is None:
            signal = self.watch(execution_id)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):  # not wait_for (see _local_end)
                    await signal.wait()
        finally:
            self.unwatch(execution_id, signal)

    async def create_successor(self, view: View, args: list[JsonValue]) -> Successor:
        successor = f"{view.root or view.execution_id}#{view.generation + 1}"
        event = records.started(
            view.workflow,
            args,
            fingerprint=self._code_digest(view.workflow),
            node=self.node,
            root=view.root or view.execution_id,
            generation=view.generation + 1,
            continued_from=view.execution_id,
            parent=view.parent,
            deadline=view.deadline,
        )
        # Claimed until the run that continued hands it on (see release_successor).
        self._claim(successor)
        try:
            token, written = await self._create(successor, [event])
            created = fold(written)
            if created.deadline is not None:
                await self._schedule_deadline(successor, created.deadline)
            return Successor(successor, token, created)
        except ExecutionAlreadyExistsError:
            existing = await self.inspect(successor)
            if existing.continued_from != view.execution_id:
                raise
            # An earlier attempt created it and died before recording the continuation.
            taken = await self._take_over(existing)
            token, existing = taken if taken is not None else (existing.fence, existing)
            return Successor(successor, token, existing)
        except BaseException:
            self._unclaim(successor)
            raise

    def release_successor(self, execution_id: str, *, look: bool = False) -> None:
        """The run that created ``execution_id`` stopped before handing it on: recovery
        may take it (it is in the log, and no run here will drive it). ``look`` (the run
        was fenced out, by a cancel for one) looks at once: a successor whose predecessor
        ended otherwise meanwhile is never handed on, and is cancelled now rather than at
        the node's next start."""
        self._unclaim(execution_id)
        if look:
            self._take_back_later(execution_id, fence_first=False)

    async def wake(self, row: TimerRecord) -> Fired:
        """What the timer service does with a due row (see loom_runtime.timers)."""
        return await self._deliver(row, patient=True)

    async def retired(self, row: TimerRecord) -> None:
        """What the timer service does after it retired ``row`` as obsolete. A sender may
        have stored a message after the look that found nothing to answer, and written
        its row again before the retirement removed it: a look after the retirement puts
        the row back (see docs/design.md, "Resuming a park")."""
        view = await self._look(row.execution_id)
        if view.park is not None and not view.terminal and await self._message_waiting(view):
            await self.schedule_wake(row)

    async def _deliver(
        self,
        row: TimerRecord,
        *,
        patient: bool = False,
        onward: list[_Hop] | None = None,
    ) -> Fired:
        """Answer the park ``row`` wakes. ``patient`` (a timer service, not the sender
        itself) leaves a sender's row whose message is not stored yet (see _sending).
        ``onward`` (a sender's): what an execution that continued as new left for its
        successor is put there for the sender to store, rather than handed on here."""
        view = await self._look(row.execution_id)
        if (
            view.deadline is not None
            and self.clock.now() >= view.deadline
            and not view.terminal
        ):
            if await self._cancel(view, _TIMED_OUT, timed_out=True):
                return "timed-out"
            view = await self._look(row.execution_id)  # it ended meanwhile
        if view.status is None:
            if onward is not None:
                # A sender's receiver, deleted since the sender found it: _post cleans up.
                raise ExecutionNotFoundError(row.execution_id)
            # A row of a deleted log: its sender may have died before it cleaned up.
            await self._drop_orphan(row.execution_id, frozenset())
            return "obsolete"
        if view.terminal:
            if view.status == "continued":
                # A sender that died between storing its message here and handing it on
                # left this row: the message is the successor's (see _hand_on).
                if onward is None:
                    await self._hand_on(view, wake=True)
                else:
                    hop = self._left_behind(view, await self.inbox.messages(row.execution_id))
                    if hop is not None:
                        onward.append(hop)
                self._forget_ended(row.execution_id)  # handed on: its inbox is read no more
            return "obsolete"
        own = [w for w in view.waits.values() if w.wake_at == row.wake_at]
        # A message's wake row (written at the sender's now) can share the instant of an
        # answered wait; it is not obsolete while a parked receiver has a message waiting.
        if (
            own
            and all(w.position in view.records for w in own)
            and not await self._message_waiting(view)
        ):
            return "obsolete"
        if view.park is None or row.execution_id in self._runs:
            return "left"  # its driver parks again (or is recovered) and re-schedules
        try:
            answered, run = await self._answer(view, view.park.sequence, prefer=row.wake_at)
            self._spawn(run)
        except ResumeRefusedError as exc:
            if exc.reason != "nothing-to-answer":
                return "left"  # answered by someone else meanwhile: the next poll decides
            if patient and not own and await self._sending(view, row):
                return "left"
            return "obsolete"
        # A row with no wait of its own (a send's wake) has done its work once the park is
        # answered; a timer's row only once its own wait is.
        return "resumed" if not own or any(w.wake_at == row.wake_at for w in answered) else "left"

    # -- internals ---------------------------------------------------------------------------

    async def _create(
        self, execution_id: str, batch: Sequence[NewEvent]
    ) -> tuple[int, tuple[Event, ...]]:
        """Append ``batch`` (EXECUTION_STARTED, and a fork's copied records) at 0 under
        token 0 (a new log's token)."""
        events = self.storage.events
        hooks = self.hooks
        if hooks.on_event is not None:
            for event in batch:
                hooks.event(execution_id, event)
        # An end that stopped nothing, left from a log deleted since: not this one's.
        self._ended_unspawned.discard(execution_id)
        try:
            written = await events.append(execution_id, batch, expected_sequence=0, fence=0)
            token = 0
        except WriteOutcomeUnknownError:
            self.lost_reply(execution_id, 0, 0, batch)
            raise
        except StaleFenceError:
            # The id was used before and deleted; its token outlived the log.
            async with _Answering(self._reusing, execution_id):  # one starter at a time here
                token, written = await self._create_reused(execution_id, batch)
        if hooks.on_durable_event is not None:
            for durable in written:
                hooks.durable_event(durable)
        return token, written

    async def _create_reused(
        self, execution_id: str, batch: Sequence[NewEvent]
    ) -> tuple[int, tuple[Event, ...]]:
        """Create the log of an id used before and deleted, under a newer token than the
        old log's, so no writer of that log can write to this one. A start of another
        process may be doing the same: the first to append creates it, and the other is
        refused as for any id that exists, and carries on the run it may have fenced out
        (docs/design.md, "Starting an id used before")."""
        events = self.storage.events
        refusal: StaleFenceError | None = None
        for _ in range(_REUSE_ATTEMPTS):
            head = await events.head(execution_id)
            if head > 0:
                raise ExecutionAlreadyExistsError(execution_id, head)
            token = await events.acquire_fence(execution_id)
            try:
                written = await events.append(
                    execution_id, batch, expected_sequence=0, fence=token
                )
            except StaleFenceError as exc:
                refusal = exc  # another start took a newer token: the head tells whose it is
                continue
            except ExecutionAlreadyExistsError:
                # Another start created it under an older token than ours, which its run
                # holds: ours has fenced that run out, so this process carries it on (once
                # this start's claim is let go).
                self._later(f"loom:carry-on:{execution_id}", functools.partial(
                    self._carry_on_fenced_out, execution_id
                ))
                raise
            return token, written
        assert refusal is not None
        raise refusal

    async def _carry_on_fenced_out(
        self, execution_id: str, *, older_than: int | None = None
    ) -> None:
        """Take over a running execution whose driver a token of ours fenced out (a run
        of this process among them: it stops at its next write, and is waited for).
        ``older_than``: our token; a log showing a newer one was taken over by someone
        after us, and is theirs."""
        await self._stopped_here(execution_id)
        if self._owned(execution_id):
            return  # another takeover of this process won the race
        view = await self.inspect(execution_id)
        if view.status != "running" or (older_than is not None and view.fence >= older_than):
            return
        try:
            fn = self._body_of(view)
        except WorkflowNotFoundError as exc:
            self.hooks.error(exc)
            return
        self._claim(execution_id)
        try:
            taken = await self._take_over(view, carried_on=True)
        except StaleFenceError:
            return  # someone took it after us: theirs now
        finally:
            self._unclaim(execution_id)
        if taken is not None:
            token, view = taken
            self._spawn(Run(self, view, token, fn))

    async def _stopped_here(self, execution_id: str) -> None:
        """Stop the run of this process that drives ``execution_id`` (fenced out, it would
        stop at its next write) and wait until it has, and for any write in flight."""
        await self._unclaimed(execution_id)
        task = self._runs.get(execution_id)
        driver = self._drivers.get(execution_id)
        if driver is not None:
            driver.stop()
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def _end_cut_short(self, execution_id: str) -> None:
        """An end (a cancel's) that took a token and was then cut short (its caller was
        cancelled, or the store failed): the token may have fenced out the execution's
        run, here or on another node, and nothing drives it then. Unless the log shows it
        ended, take a fresh token (the end in flight can no longer land) and carry it on
        as a restarted node would; see docs/design.md, "A cancelled call"."""
        await self._stopped_here(execution_id)
        try:
            if (await self.inspect(execution_id)).terminal or self._owned(execution_id):
                await self._report_landed(execution_id)
                return
            token = await self.storage.events.acquire_fence(execution_id)
            await self._report_landed(execution_id)
        except StoreClosedError:
            raise
        except StorageError as exc:
            self.hooks.storage_error(execution_id, exc)
            self._strand(execution_id)  # no run of ours is left to stand in its way
            return
        await self._carry_on_fenced_out(execution_id, older_than=token)

    async def _unowned_view(self, execution_id: str) -> View | None:
        """The execution's view when it runs under this node and no run of this process
        drives it or is about to; None otherwise."""
        while True:
            # A claim is a write in flight (a start, an answer, another takeover) whose
            # outcome decides: wait for it. A start refused because the id exists leaves
            # the execution to recovery; one that succeeds has registered its run by then.
            await self._unclaimed(execution_id)
            if self._owned(execution_id):
                return None
            view = await self.inspect(execution_id)
            if view.status == "suspended" and view.node == self.node:
                await self._rearm(view)
                return None
            if view.status != "running" or view.node != self.node:
                return None
            if view.continued_from is not None and not await self._handed_on(view):
                return None
            # Checked again after the read: a run of this process may have written it
            # meanwhile (its first write is in the log before its writer hears back).
            if execution_id not in self._claims:
                return None if self._owned(execution_id) else view

    async def _rearm(self, view: View) -> None:
        """Schedule again the timer row of each pending timed wait of ``view``'s park that
        has none. A row is keyed by execution and instant, so a wait at the instant of an
        earlier one shares its row, and whoever retires that row for the earlier wait (a
        timer service, another node) can take it from the later park just after the park
        scheduled it. The run that parked answers a due wait itself; if it cannot (it died,
        or lost the fence), this puts the row back (docs/design.md, "A timer row is retired
        only when its own wait is answered"). A message waiting for the park with no row
        at all gets one too: a timer service that retired its row as having nothing to
        answer can die before it looks again (docs/design.md, "Resuming a park")."""
        waits = view.pending_waits()
        wakes = {w.wake_at for w in waits if w.wake_at is not None}
        if not wakes and all(not w.topics for w in waits):
            return
        timers = self.storage.timers
        have = {row.wake_at for row in await timers.pending(view.execution_id)}
        if not have and (waiting := await self._waiting_message(view)) is not None:
            # At the instant its sender's row had, so the row names its message.
            wakes.add(waiting.wake_at or self.clock.now())
        for wake_at in sorted(wakes - have):
            await self.schedule_wake(TimerRecord(view.execution_id, wake_at))

    async def _handed_on(self, view: View) -> bool:
        """Whether the execution that continued as ``view``'s has recorded it. A successor
        is created before its predecessor records EXECUTION_CONTINUED; after a crash in
        between, both are running, and the predecessor's replay continues again and takes
        the successor over: recovering the successor as well would drive it twice. So it
        is the predecessor's until that record is written. One whose predecessor ended
        otherwise meanwhile (cancelled) is never handed on: it is cancelled."""
        assert view.continued_from is not None
        predecessor = await self.inspect(view.continued_from)
        if predecessor.status is None:
            return True  # pruned: only a finished predecessor can be
        if predecessor.status == "continued" and predecessor.successor == view.execution_id:
            return True
        if predecessor.terminal:
            await self._cancel(
                view,
                f"{view.continued_from!r} ended {predecessor.status} without continuing as "
                f"{view.execution_id!r}",
            )
        return False

    def _claim(self, execution_id: str) -> None:
        self._claims[execution_id] = self._claims.get(execution_id, 0) + 1

    def _unclaim(self, execution_id: str) -> None:
        left = self._claims.get(execution_id, 0) - 1
        if left > 0:
            self._claims[execution_id] = left
            return
        self._claims.pop(execution_id, None)
        if self._unclaimed_waiters:
            waiter = self._unclaimed_waiters.pop(execution_id, None)
            if waiter is not None:
                waiter.set()

    async def _unclaimed(self, execution_id: str) -> None:
        """Wait until no write of this process claims ``execution_id``."""
        while execution_id in self._claims:
            waiter = self._unclaimed_waiters.get(execution_id)
            if waiter is None:
                waiter = self._unclaimed_waiters[execution_id] = asyncio.Event()
            await waiter.wait()

    def _owned(self, execution_id: str) -> bool:
        """Whether a run of this process drives ``execution_id``, or is about to: its
        first write (a start, an answer, a takeover) can be in the log before its writer
        hears back and spawns the run, and recovery must not take it over then."""
        return (
            execution_id in self._runs
            or execution_id in self._claims
            or execution_id in self._resumers
        )

    def _spawn(self, run: Run, context: contextvars.Context | None = None) -> None:
        if not self._entered:
            # The app was left while what spawns it (a resume, a poll, a send) was under
            # way: the execution stays running, as a process that exits leaves it.
            raise AppNotRunningError(f"driving {run.execution_id!r}", left=True)
        task = asyncio.get_running_loop().create_task(
            self._drive(run), name=f"loom:{run.execution_id}", context=context
        )
        self._runs[run.execution_id] = task
        self._drivers[run.execution_id] = run
        self._driving.add(task)
        task.add_done_callback(self._driving.discard)

    async def _drive(self, run: Run) -> Event | None:
        """Drive ``run``, and the run that answering its own park starts (in this task);
        return the terminal event when the execution finished."""
        execution_id = run.execution_id
        task = asyncio.current_task()
        assert task is not None
        ended: Event | None = None
        # Every run's body starts from the context vars the first one started from; a
        # body that set some gets its successor a task of its own, started from those.
        base = contextvars.copy_context()
        try:
            next_run: Run | None = run
            while next_run is not None:
                if next_run is not run and not self._entered:
                    # The app was left while this run answered its own park: the next
                    # run is the next start's, as after a process that exits (an
                    # execute() caller's task, which leaving does not cancel, ends here).
                    break
                if next_run is not run and contextvars.copy_context() != base:
                    self._spawn(next_run, base)
                    break
                run = next_run
                self._runs[execution_id] = task
                if self._driven_here is not None:
                    self._driven_here.add(execution_id)
                self._drivers[execution_id] = run
                if self._ended_unspawned and execution_id in self._ended_unspawned:
                    self._ended_unspawned.discard(execution_id)
                    run.stop()
                try:
                    outcome = await run.drive()
                finally:
                    if self._runs.get(execution_id) is task:
                        del self._runs[execution_id]
                    if self._drivers.get(execution_id) is run:
                        del self._drivers[execution_id]
                ended, next_run = await self._settle(run, outcome)
        except asyncio.CancelledError:
            raise
        except StorageError as exc:
            self.hooks.storage_error(execution_id, exc)
            self._strand(execution_id)
        except AppNotRunningError as exc:
            _log.debug("%s", exc)  # a successor left as the app was: the next start's
        except Exception as exc:
            # A write the store refused as bad input (a cipher's subject_of that raised,
            # an id too long for a tenant's prefix): nothing was written, the execution
            # stays running, and result() raises what stopped it.
            if isinstance(exc, _FOR_GOOD):
                self._halted(execution_id, exc)
            self.hooks.error(exc)
        finally:
            self.changed(execution_id)
            ended_here = self._ended.get(execution_id)
            if ended_here is not None and ended_here[0] is task:
                del self._ended[execution_id]
            # Wake whoever waits for this run's end (a handle's result), directly rather
            # than through a done callback of the task: one hop of the loop less.
            for end in self._ends.pop(execution_id, ()):
                if not end.done():
                    end.set_result(ended)
        return ended

    async def _settle(self, run: Run, outcome: Outcome) -> tuple[Event | None, Run | None]:
        """Act on how a run ended; return the terminal event it wrote (None when it parked
        or stopped) and the run to drive next when it answered its own park."""
        execution_id = run.execution_id
        if outcome.kind == "stopped":
            reason = outcome.reason
            if (
                run.scheduled
                and self._entered
                and (reason is None or isinstance(reason, FencedOut))
            ):
                # Stopped by a cancel, or fenced out, as it parked: its rows may have
                # landed after the cancel removed the execution's.
                await self._retire_rows_if_ended(execution_id)
            if isinstance(reason, ReplayDivergedError | RunStoppedError):
                self._halted(execution_id, reason)
                self.hooks.error(reason)
            elif isinstance(reason, FencedOut):
                _log.debug("%s", reason)
                self._watch_quiet_rival(run)
            elif isinstance(reason, TimedOut):
                await self._time_out(execution_id)
            elif isinstance(reason, StorageError):
                # A store call failed: the run has told on_storage_error already. A write
                # of the run still in flight goes at the head it knew: once the log holds
                # anything there, it has landed or never will, and no token is taken (one
                # would fence out the run of a node that answered a park that landed).
                final = run.final_view()
                self._strand(
                    execution_id,
                    final.carried_on,
                    settled=functools.partial(_written_past, head=final.head),
                )
            elif not isinstance(reason, SimulatedCrash) and reason is not None:
                # A log the run cannot read (shredded, say), or a write a layer of the
                # store refused for good: nothing was written and the execution stays
                # running, as after a crash, and result() raises what stopped it.
                if isinstance(reason, _FOR_GOOD):
                    self._halted(execution_id, reason)
                self.hooks.error(reason)
            return None, None
        if self.halted:
            self.halted.pop(execution_id, None)
        if self._quiet_takeovers:
            self._quiet_takeovers.pop(execution_id, None)
        if outcome.kind == "suspended":
            if outcome.tried:
                return None, None
            final = run.final_view()
            return None, await self._after_park(final, outcome.park_seq)
        if outcome.kind == "continued":
            assert outcome.successor is not None
            successor = outcome.successor
            try:
                final = run.final_view()
                if final.deadline is not None:
                    # The successor has a row of its own at the same deadline.
                    await self._retire_row(TimerRecord(execution_id, final.deadline))
                await self._hand_on(final, wake=False)
                if successor.execution_id not in self._runs:
                    self._spawn(
                        Run(self, successor.view, successor.token, self._body_of(successor.view))
                    )
            finally:
                self._unclaim(successor.execution_id)
        elif run.waited or run.deadline is not None:
            try:
                await self.storage.timers.cancel(execution_id)
            except StoreClosedError:
                raise
            except StorageError as exc:
                # The execution has ended: rows left are found obsolete when they fall due.
                self.hooks.storage_error(execution_id, exc)
        self._forget_ended(execution_id)
        return run.last_written, None

    async def _after_park(self, view: View, park_seq: int) -> Run | None:
        """Answer our own park at once when it is already answerable (a timer that is due,
        as ``ctx.sleep(0)``'s, or a message that arrived while the body ran); the run that
        goes on from the answer, or None."""
        now = self.clock.now()
        pending = view.pending_waits()
        due = any(w.wake_at is not None and w.wake_at <= now for w in pending)
        if not due and not await self._message_waiting(view):
            return None
        execution_id = view.execution_id
        try:
            fn = self._body_of(view)  # refuse an unknown workflow before any token is taken
        except LoomError as exc:
            _log.debug("self-resume of %s left to the timer rows: %s", execution_id, exc)
            return None
        self._claim(execution_id)  # until _drive takes the run on, with no await between
        try:
            answered = await self.answer_own_park(view, park_seq)
        finally:
            self._unclaim(execution_id)
        if answered is None:
            return None
        token, resumed = answered
        return Run(self, resumed, token, fn)

    async def answer_own_park(self, view: View, park_seq: int) -> tuple[int, View] | None:
        """Answer a park this process just wrote, whose wait is already answerable (a due
        timer, a message that arrived while the body ran): the token now held and the view
        past the answer, or None when it cannot be answered here (someone else answered
        it, or the store failed: the timer row is left to the service). Run._go_on goes on
        from it in place; _after_park hands it to a new run."""
        execution_id = view.execution_id
        now = self.clock.now()
        try:
            answered, token, resumed = await self._answer_view(view, park_seq, None, False)
        except ResumeRefusedError:
            return None  # answered by someone else (a cancel, a resume), or nothing to answer
        except LoomError as exc:
            _log.debug("self-resume of %s left to the timer rows: %s", execution_id, exc)
            with contextlib.suppress(LoomError):  # a store that failed may fail again
                await self._rearm(view)
            return None
        for wake_at in sorted({w.wake_at for w in answered if w.wake_at is not None}):
            if wake_at > now:
                continue
            try:
                await self.storage.timers.complete(execution_id, wake_at)
            except LoomError as exc:
                # The answer is written; a row left behind is retired as obsolete.
                self.hooks.storage_error(execution_id, exc)
                break
        return token, resumed

    async def _sending(self, view: View, row: TimerRecord) -> bool:
        """Whether ``row`` may be a sender's wake row whose message is not stored yet: it
        is younger than SENDER_GRACE, the park waits for a message, and no message in the
        inbox names the row. A sender writes the row, then stores the message naming it;
        a row retired in between would leave a sender that dies after storing with its
        message undelivered (docs/design.md, "Resuming a park")."""
        if self.clock.now() - row.wake_at >= SENDER_GRACE:
            return False
        if all(not wait.topics for wait in view.pending_waits()):
            return False  # nothing in this park could take a message
        return not await self.inbox.names(view.execution_id, row.wake_at)

    async def _message_waiting(self, view: View) -> bool:
        """Whether a receive of the open park has a message in the inbox."""
        return await self._waiting_message(view) is not None

    async def _waiting_message(self, view: View) -> Message | None:
        """A message in the inbox for a receive of the open park, if there is one."""
        for wait in view.pending_waits():
            if wait.topics:
                found = await self.inbox.next(view.execution_id, wait.topics, view.consumed)
                if found is not None:
                    return found
        return None

    async def _answer(
        self,
        view: View,
        park_seq: int,
        *,
        prefer: datetime | None = None,
        force: bool = False,
    ) -> tuple[tuple[Wait, ...], Run]:
        """Answer the park through :func:`answer_park`; the waits answered, and the run that
        drives the body on from the answer (for the caller to drive or spawn). No one is
        asked: ``app.resume`` asked ``authorize`` about its caller first, and the runtime's
        own answers (a due timer, a message's delivery) are no caller's action."""
        if view.status is not None:
            fn = self._body_of(view)  # refuse an unknown workflow before any token is taken
            await self._check_code(view, fn)
        waits, token, resumed = await self._answer_view(view, park_seq, prefer, force)
        return waits, Run(self, resumed, token, fn)

    async def _check_code(self, view: View, fn: Callable[..., Awaitable[Any]]) -> None:
        """Refuse, before any token is taken or anything written, to answer the park of an
        execution whose log the app's code no longer matches: raise the
        ReplayDivergedError a replay of it (as ``check_replay`` makes, appending nothing)
        meets. Only when the body's code is not the code that drove the execution last
        (started it, took it over or answered its park): the same code replays the log as
        it wrote it. Not the code that started it, once other code has driven it since: a
        rollback after a deploy would answer parks that the log's newer calls diverge
        from."""
        if view.park is None or view.terminal:
            return  # nothing to answer: the resume refuses it without a replay
        if self._code_digest(view.workflow) == view.driven_by:
            return
        outcome = await Run(self, view, view.fence, fn, replay_only=True).drive()
        if outcome.kind == "stopped" and isinstance(outcome.reason, ReplayDivergedError):
            raise outcome.reason

    async def _answer_view(
        self,
        view: View,
        park_seq: int,
        prefer: datetime | None,
        force: bool,
    ) -> tuple[tuple[Wait, ...], int, View]:
        """Answer the park through :func:`answer_park`; the waits answered (the one chosen
        first), the token now held and the view past the answer. A caller cancelled
        meanwhile (a resume's, a sender's, an ``execute`` whose run answers its own park)
        leaves the execution to the app: the answer may land yet."""
        events = self.storage.events
        chosen: list[tuple[Wait, ...]] = []

        async def answer(current: View) -> Sequence[NewEvent]:
            batch, waits = await self._answer_events(current, park_seq, prefer, force)
            chosen[:] = [waits]
            return batch

        async with self._answering(view.execution_id):
            try:
                token, resumed, written = await answer_park(
                    events, view, park_seq, answer, writing=self._writing,
                    lost=functools.partial(self.lost_reply, view.execution_id),
                )
            except asyncio.CancelledError:
                self._take_back_later(
                    view.execution_id,
                    fence_first=True,
                    settled=functools.partial(_answered, park_seq=park_seq),
                )
                raise
            except WriteOutcomeUnknownError:
                # The answer may have landed; not once another answer is in its place (a
                # token would fence out the run of whoever answered).
                self._strand(
                    view.execution_id, settled=functools.partial(_answered, park_seq=park_seq)
                )
                raise
        if self.hooks.on_durable_event is not None:
            for event in written:
                self.hooks.durable_event(event)
        self.changed(view.execution_id)
        return chosen[0], token, resumed

    def _writing(self, view: View, batch: Sequence[NewEvent]) -> None:
        """Tell ``on_event`` of an answer about to be appended."""
        if self.hooks.on_event is not None:
            for event in batch:
                self.hooks.event(view.execution_id, event)

    def _answering(self, execution_id: str) -> _Answering:
        """One resumer at a time per execution in this process. Two at once (a send's
        delivery and the timer service firing the same row) would take the fence from each
        other between acquire and append until both gave up contended; one after the other,
        the second finds the park answered and is refused."""
        return _Answering(self._resumers, execution_id)

    async def _answer_events(
        self, view: View, park_seq: int, prefer: datetime | None, force: bool
    ) -> tuple[list[NewEvent], tuple[Wait, ...]]:
        """The answer to the park: its events, and the waits they answer (the one chosen
        first)."""
        pending = view.pending_waits()
        for wait in pending:
            if wait.topics:
                found = await self.inbox.next(view.execution_id, wait.topics, view.consumed)
                if found is not None:
                    any_of = wait.topics if wait.call == "receive_any" else ()
                    batch = [
                        records.consumed(
                            wait.position, found.topic, found.sequence, found.value, any_of
                        ),
                        records.resumed(
                            park_seq,
                            wait.position,
                            {"kind": "message", "message": found.sequence},
                            self.node,
                            self._code_digest(view.workflow),
                        ),
                    ]
                    return batch, (wait,)
        timed = [w for w in pending if w.wake_at is not None]
        if len(timed) > 1:
            timed.sort(key=_wake_order)
        pick = None
        if prefer is not None:
            pick = next((w for w in timed if w.wake_at == prefer), None)
        if pick is None and timed:
            now = self.clock.now()
            pick = next((w for w in timed if w.wake_at is not None and w.wake_at <= now), None)
        if pick is None and force and timed:
            pick = timed[0]
        if pick is None:
            raise ResumeRefusedError(
                view.execution_id,
                "nothing-to-answer",
                "it waits for messages and none is there" if pending else "it waits for nothing",
            )
        # Every other timed wait that is due is answered in the same write: a gather of
        # many sleeps would otherwise be resumed, replayed and parked again once per wait.
        now = self.clock.now()
        answered = [pick]
        for wait in timed:
            if len(answered) == _ANSWERED_AT_ONCE:
                break
            if wait is not pick and wait.wake_at is not None and wait.wake_at <= now:
                answered.append(wait)
        fingerprint = self._code_digest(view.workflow)
        batch = [
            records.resumed(
                park_seq,
                wait.position,
                {"kind": "timer" if wait.call == "sleep" else "timeout"},
                self.node,
                fingerprint,
            )
            for wait in answered
        ]
        return batch, tuple(answered)

    def _code_digest(self, workflow: str) -> str:
        """The digest of ``workflow``'s code, taken at its first use (when the modules
        are imported, so it covers helpers defined below the workflow); "" for a name
        not registered here."""
        digest = self._fingerprints.get(workflow)
        if digest is None:
            fn = self._workflows.get(workflow)
            if fn is None:
                return ""
            digest = self._fingerprints[workflow] = code_digest(fn)
        return digest

    async def _allows(self, principal: object, action: str, execution_id: str) -> bool:
        """What the ``authorize`` hook says (True when there is none)."""
        if self._authorize is None:
            return True
        verdict = self._authorize(principal, action, execution_id)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

    async def _record_denial(self, principal: object, action: str, view: View) -> None:
        """Append EXECUTION_DENIED, unfenced, to ``view``'s execution."""
        try:
            recorded: JsonValue = json_value(principal, "principal")
        except InvalidInputError:
            recorded = shown_safely(principal)
        events = self.storage.events
        denial = records.denied(action, recorded)
        self.hooks.event(view.execution_id, denial)
        head = view.head
        while True:
            try:
                self._reported(
                    await events.append(view.execution_id, [denial], expected_sequence=head)
                )
                break
            except SequenceConflictError as exc:
                if exc.actual_head < head:
                    return  # deleted meanwhile: a denial must not make the log anew
                head = exc.actual_head

    async def _take_over(
        self, view: View, *, carried_on: bool = False
    ) -> tuple[int, View] | None:
        """Fence out whatever drove ``view``'s execution before, and record the takeover
        (``carried_on``: by this live process, of its own run; see records.recovered)."""
        events = self.storage.events
        execution_id = view.execution_id
        token = (
            await events.acquire_fence(execution_id)
            if "acquire_fence" in events.capabilities
            else view.fence
        )
        recovered = records.recovered(
            self.node, token, self._code_digest(view.workflow), carried_on=carried_on
        )
        self.hooks.event(execution_id, recovered)
        view = await read_tail(events, view)
        while True:
            if view.status != "running":
                return None
            try:
                written = await events.append(
                    execution_id, [recovered], expected_sequence=view.head, fence=token
                )
            except SequenceConflictError:
                moved = await tail_past_conflict(events, view)
                if moved is None:
                    return None  # deleted under the takeover: nothing runs there
                view = moved
                continue
            self._reported(written)
            if view.deadline is not None:
                await self._schedule_deadline(execution_id, view.deadline)
            return token, fold(written, into=view)

    async def _time_out(self, execution_id: str) -> None:
        """Cancel, as timed out, an execution whose run stopped at its deadline."""
        view = await self.inspect(execution_id)
        if not view.terminal:
            await self._cancel(view, _TIMED_OUT, timed_out=True)

    def lost_reply(
        self, execution_id: str, sequence: int, fence: int, batch: Sequence[NewEvent]
    ) -> None:
        """An append of this process whose outcome was not learned (its reply lost with
        the connection): :meth:`_report_landed` tells ``on_durable_event`` of its events
        if the take-back that follows finds them in the log, so a write that landed
        unheard is still heard of, once (and a cancel whose answer landed so is one that
        cancelled, hook or no hook)."""
        self._unheard.setdefault(execution_id, []).append(_Unheard(sequence, fence, tuple(batch)))

    async def _report_landed(self, execution_id: str) -> bool:
        """Tell ``on_durable_event`` of the writes of this process to ``execution_id``
        whose outcome was not learned and that the log shows landed. Called once the
        take-back has settled the log (its token, a takeover's, an end), so none can land
        later. True when one had landed."""
        landed_any = False
        for unheard in self._unheard.get(execution_id, ()):
            landed = await self.storage.events.read(
                execution_id, from_sequence=unheard.sequence, limit=len(unheard.batch)
            )
            # A token is one writer's: the batch at its place under our token is ours.
            if len(landed) == len(unheard.batch) and all(
                event.fence == unheard.fence
                and event.kind == new.kind
                and event.payload == new.payload
                for event, new in zip(landed, unheard.batch, strict=True)
            ):
                self._reported(landed)
                landed_any = True
        self._unheard.pop(execution_id, None)
        return landed_any

    def _reported(self, written: Sequence[Event]) -> None:
        """Tell ``on_durable_event`` of events the app itself wrote (a run reports its
        own)."""
        if self.hooks.on_durable_event is not None:
            for event in written:
                self.hooks.durable_event(event)

    async def _cancelled(self, execution_id: str) -> None:
        self.halted.pop(execution_id, None)  # what result() raises now is the cancel
        self._forget_ended(execution_id)
        await self.storage.timers.cancel(execution_id)
        self.changed(execution_id)

    async def _retire_rows_if_ended(self, execution_id: str) -> None:
        """A run fenced out as it parked may have written its timer rows after whoever
        ended the execution (a cancel) removed them: remove them if it has ended."""
        try:
            if (await self._look(execution_id)).terminal:
                await self.storage.timers.cancel(execution_id)
        except StoreClosedError:
            raise
        except StorageError as exc:
            # Left, they are found obsolete when they fall due.
            self.hooks.storage_error(execution_id, exc)

    def _halted(self, execution_id: str, reason: LoomError) -> None:
        """Keep what stopped ``execution_id``'s run here for result() to raise: the
        latest ``_HALTED_KEPT``, each until the execution ends (a halt holds its
        traceback, and with it the body's frames)."""
        halted = self.halted
        halted.pop(execution_id, None)
        halted[execution_id] = reason
        while len(halted) > _HALTED_KEPT:
            del halted[next(iter(halted))]


@dataclass(slots=True)
class _Resumers:
    """The resumers of one execution in this process, in line."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0


@final
class _Answering:
    """``async with``: hold an in-process lock of one execution, from a table of them
    (its resumers', or its reusing starts'; a class, not a generator context manager: it
    is on every resume's path)."""

    __slots__ = ("_execution_id", "_resumers", "_table")

    def __init__(self, table: dict[str, _Resumers], execution_id: str) -> None:
        self._table = table
        self._execution_id = execution_id
        resumers = table.get(execution_id)
        if resumers is None:
            resumers = table[execution_id] = _Resumers()
        self._resumers = resumers

    async def __aenter__(self) -> None:
        resumers = self._resumers
        resumers.waiting += 1
        try:
            await resumers.lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._resumers.lock.release()
        self._leave()

    def _leave(self) -> None:
        resumers = self._resumers
        resumers.waiting -= 1
        if resumers.waiting == 0 and self._table.get(self._execution_id) is resumers:
            del self._table[self._execution_id]


def _exists(view: View) -> bool:
    """Whether ``view``'s log has been written: a first write in flight cannot land."""
    return view.status is not None


def _answered(view: View, *, park_seq: int) -> bool:
    """Whether the park at ``park_seq`` is no longer open: an answer in flight cannot
    land."""
    return not still_parked(view, park_seq)


def _written_past(view: View, *, head: int) -> bool:
    """Whether ``view``'s log holds a write at ``head``: a write in flight there has landed
    or never will."""
    return view.head > head


def _wake_order(wait: Wait) -> tuple[datetime, Position]:
    assert wait.wake_at is not None
    return wait.wake_at, wait.position


async def _stop_tasks(tasks: Collection[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one has ended; their exceptions are dropped.

    A task can swallow a cancellation and run on: on Python 3.11, ``asyncio.wait_for``
    returns a result that arrived together with the cancellation instead of raising it,
    and a driver beneath the stores may wait that way (psycopg_pool waits so for a free
    connection). The timer service would then poll on for ever, and leaving the app would
    hang; so a task still running CANCEL_AGAIN_AFTER seconds after its cancellation is
    cancelled again."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_AFTER)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not report it as never retrieved


def _check_timeout(timeout: object) -> float | None:
    """A wait's ``timeout=`` in seconds: None, or a number of seconds from 0 to
    MAX_DURATION's, or a timedelta of them."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is not None and (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 0 <= seconds <= _MAX_WAIT  # NaN compares false
    ):
        raise InvalidDurationError(
            f"timeout= must be a number of seconds from 0 to {_MAX_WAIT:.0f} (1000 years; "
            f"or a timedelta), or None to wait as long as it takes, not {timeout!r}"
        )
    return None if seconds is None else float(seconds)


def _deadline(timeout: object, now: datetime, what: str) -> datetime:
    """The deadline ``timeout`` (more than 0 seconds, or a timedelta) after ``now``;
    refused when it would fall after LATEST_DEADLINE."""
    seconds = seconds_of(timeout, what, endless="leave it out for no deadline", positive=True)
    check_end(seconds, timeout, what, now, "leave it out for no deadline")
    return now + timedelta(seconds=seconds)


_MAX_WAIT: Final = MAX_DURATION.total_seconds()
_LOCAL_LOOK: Final = 1.0
"""How often those waiting for a run of this process are woken to read the log."""
_FARTHEST_AT: Final = 2**53 - 1
"""The largest fork ``at`` kept as asked: no body makes that many calls, and every JSON
reader takes it as an exact int."""
_KEPT_FROM: Final = 64
"""From how many events and waits a log's view is kept, for the next look to fold only
the tail."""
_KEPT_VIEWS: Final = 1024
_ANSWERED_AT_ONCE: Final = 256
"""How many due timed waits of one park one answer takes at most (one event each)."""
"""How long ``Handle.result`` waits for a run of its process before it reads the log."""


def _remaining(loop: asyncio.AbstractEventLoop, deadline: float | None) -> float | None:
    return None if deadline is None else deadline - loop.time()


def _check_id(execution_id: object) -> str:
    """An id the app is asked about: the kernel's rules, and not one of the runtime's own."""
    if (
        type(execution_id) is str
        and execution_id.isascii()
        and execution_id.isprintable()  # in ASCII: no control character
        and 0 < len(execution_id) <= MAX_ID_BYTES
        and execution_id[0] != "$"
    ):
        return execution_id  # the common id, checked inline: what follows would pass it
    if isinstance(execution_id, str) and execution_id.startswith("$"):
        raise ReservedExecutionIdError(execution_id)
    # The store's check, so an id is refused with the store's InvalidExecutionIdError
    # whether the app or the store met it first (an empty one, one that is not a str).
    return check_execution_id(execution_id)


MAX_NEW_ID_BYTES: Final = MAX_ID_BYTES - 32
"""The longest id a start may give an execution, in UTF-8 bytes: the store's limit less
room for the ids the runtime derives from it (its inbox, ``$inbox:<id>``, and its
successors, ``<id>#<generation>``)."""

_PROBED_ID_LENGTH: Final = 256
"""Ids longer than this (in UTF-8 bytes) are checked against the store's own limit, which
a decorator may lower, before a start writes anything; shorter ones leave room under any
tenant name."""


_REUSE_ATTEMPTS: Final = 8

_TIMED_OUT: Final = "its execution_timeout passed"
"""The reason a cancel by the execution's deadline records."""
"""How often a start of an id used before takes a newer token when starts of other
processes keep taking newer ones before it appends; then it raises StaleFenceError."""


def _check_if_exists(if_exists: object, execution_id: str | None) -> None:
    if if_exists not in ("raise", "attach"):
        raise InvalidInputError(
            f"if_exists= is 'raise' (refuse an id that has an execution) or 'attach' (give "
            f"that execution's handle), not {if_exists!r}"
        )
    if if_exists == "attach" and execution_id is None:
        raise InvalidInputError(
            "if_exists='attach' needs id=: a random id never has an execution to attach to"
        )


_STATUSES: Final[frozenset[str]] = frozenset(
    ("running", "suspended", "completed", "failed", "cancelled", "continued")
)


def _statuses(status: object) -> frozenset[str] | None:
    """``app.executions(status=...)``: one status or a collection of them, checked."""
    if status is None:
        return None
    if isinstance(status, str) or not isinstance(status, Iterable) or isinstance(
        status, Mapping
    ):
        given: tuple[object, ...] = (status,)
    else:
        given = tuple(status)
    unknown = [s for s in given if not isinstance(s, str) or s not in _STATUSES]
    if unknown or not given:
        raise InvalidInputError(
            f"status= takes one of {', '.join(sorted(_STATUSES))}, or a collection of them, "
            f"not {status!r}"
        )
    return frozenset(cast("tuple[str, ...]", given))


def _check_new_id(execution_id: object) -> str:
    """An id a start gives a new execution: not a successor's name, and short enough for
    the ids derived from it."""
    execution_id = _check_id(execution_id)
    if (
        len(execution_id) <= MAX_NEW_ID_BYTES
        and execution_id.isascii()  # one byte a character
        and ("#" not in execution_id or not execution_id[-1].isdigit())
    ):
        return execution_id  # neither too long nor a successor's form
    if SUCCESSOR_SUFFIX.search(execution_id):
        raise ReservedExecutionIdError(execution_id, successor=True)
    size = len(execution_id.encode("utf-8"))
    if size > MAX_NEW_ID_BYTES:
        raise InvalidExecutionIdError(
            execution_id,
            f"a new execution's id is at most {MAX_NEW_ID_BYTES} UTF-8 bytes (the store's "
            f"{MAX_ID_BYTES} less room for its inbox's and successors' ids), not {size}",
        )
    return execution_id


_HALTED_KEPT: Final = 1024
"""How many halted executions an app keeps what stopped them for (oldest dropped)."""

_FOR_GOOD: Final = (InvalidInputError, PayloadShreddedError)
"""The errors a run stops on that trying again would only meet again: result() raises
them (a refusal of bad input, a payload whose key was destroyed). Any other stays
running for a later takeover to carry on, as a store's failure does."""


def _explained(refused: ExecutionAlreadyExistsError, why: str) -> ExecutionAlreadyExistsError:
    """``refused``, its message saying ``why`` too (in the message, not a note, so a log
    that prints the error alone keeps it)."""
    refused.args = (f"{refused}; {why}",)
    return refused


def _constant(batch: list[NewEvent]) -> Callable[[View], Awaitable[Sequence[NewEvent]]]:
    async def answer(_: View) -> Sequence[NewEvent]:
        return batch

    return answer


def _arity(fn: Callable[..., Any]) -> tuple[int, int | None]:
    """The fewest and the most positional arguments ``fn`` takes after ``ctx`` (the most
    None for ``*args``); InvalidOptionError for a body no start could call (no ``ctx``, or
    a keyword-only parameter without a default: a start passes arguments by position)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the body decides
        return 0, None
    positional = [
        p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    if not positional and not variadic:
        raise InvalidOptionError(
            f"@app.workflow() needs an 'async def' taking ctx first, not {fn!r} (it takes "
            "no positional parameter)"
        )
    for p in parameters:
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            raise InvalidOptionError(
                f"workflow {fn.__qualname__!r} has a keyword-only parameter {p.name!r} "
                "without a default; app.start passes a workflow's arguments by position"
            )
    after_ctx = positional[1:]
    least = sum(1 for p in after_ctx if p.default is p.empty)
    return least, None if variadic else len(after_ctx)


# Context is re-exported here for type checkers reading ``app.workflow`` bodies.
_ = (Context, INBOX_PREFIX)


def _not_a_body(fn: object) -> str:
    """Why ``fn`` cannot be registered as a workflow body, naming the likely mistake."""
    if inspect.isasyncgenfunction(fn):
        return (
            f"@app.workflow() needs an 'async def' that returns its result, not an async "
            f"generator ({fn!r} yields): return the items in a list, or publish each with "
            "ctx.set_event"
        )
    try:
        wrapped = inspect.unwrap(fn) if callable(fn) else fn
    except ValueError:  # a chain of __wrapped__ that loops
        wrapped = fn
    if wrapped is not fn and inspect.iscoroutinefunction(wrapped):
        return (
            f"@app.workflow() needs an 'async def' taking ctx first, not {fn!r}, a sync "
            f"wrapper of the async def {wrapped!r} (a decorator's): make the wrapper "
            "'async def' (return await fn(*args)), or mark it with "
            "inspect.markcoroutinefunction (Python 3.12+)"
        )
    return f"@app.workflow() needs an 'async def' taking ctx first, not {fn!r}"
