"""What a workflow body sees: :class:`Context`, and the durable calls it makes.

Each durable call takes its *position* when it is made, not when it finishes: a call in the
body is ``(k,)``; a branch of :meth:`Context.gather` made at position ``p`` numbers its own
calls ``p + (branch, k)``. On replay each call is matched against the log by position.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import sys
import uuid as uuid_module
from collections.abc import Awaitable, Callable, Coroutine, Generator, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import CodeType
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    Literal,
    NoReturn,
    TypeVar,
    TypeVarTuple,
    final,
    overload,
)

from loom_core import InvalidInputError, JsonValue
from loom_runtime.clock import LATEST_DEADLINE, MAX_DURATION, shown
from loom_runtime.errors import ContextOutsideBodyError, InvalidDurationError
from loom_runtime.records import (
    Position,
    Received,
    check_text,
    json_arguments,
    json_value,
    position_text,
)
from loom_runtime.retry import Retry

if TYPE_CHECKING:
    from loom_runtime.driver import Run

__all__ = ["Context", "Durable", "Received", "StepInfo", "step_info"]

T = TypeVar("T")
T1 = TypeVar("T1")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
T4 = TypeVar("T4")
Args = TypeVarTuple("Args")


@dataclass(slots=True)
class Branch:
    """The numbering of one line of durable calls, and the task that makes them (the
    body's, or a ``ctx.gather`` branch's)."""

    prefix: Position = ()
    counter: int = 0
    owner: asyncio.Task[Any] | None = None
    run: Run | None = None
    """The run whose body this line is (None outside every body, and in a step)."""

    def peek(self) -> Position:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # a thread with no event loop, handed the body's context
            task = None
        if task is not self.owner:
            # A task the body made (asyncio.create_task copies the context, and with it
            # this branch): its calls would take positions in whatever order the tasks
            # run, and could outlive the body.
            raise ContextOutsideBodyError("task")
        return (*self.prefix, self.counter)

    def take(self) -> Position:
        position = self.peek()
        self.counter += 1
        return position


class _Outside(Branch):
    """The branch of code that is not a workflow body's: a durable call made there (with
    a ``ctx`` kept after its body ended, or passed to code the body does not await) is
    refused, naming the mistake."""

    def peek(self) -> Position:
        raise ContextOutsideBodyError("outside")


class InStep(Branch):
    """The branch of a step's function while it runs: a durable call there is refused.
    It knows which attempt of which step runs, for :func:`step_info`."""

    __slots__ = ("attempt", "execution_id", "name", "step_position")

    def __init__(self, execution_id: str, position: Position, name: str, attempt: int) -> None:
        # Plain stores, not Branch's generated __init__: one is made per attempt.
        self.prefix = ()
        self.counter = 0
        self.owner = None  # no task's: awaiting a durable call here is refused too
        self.run = None
        self.execution_id = execution_id
        self.step_position = position
        self.name = name
        self.attempt = attempt

    def peek(self) -> Position:
        raise ContextOutsideBodyError("step")


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The step whose function is running: see :func:`step_info`."""

    execution_id: str
    position: str
    """The step's position written with dots, as errors write it (``"3"``, ``"4.1.0"``)."""
    name: str
    attempt: int
    """1 plus the failed attempts the log holds for the step: retries count on across a
    process death; an attempt cut short by one is made again under its number."""

    @property
    def idempotency_key(self) -> str:
        """``<execution id>:<position>``: the same for every attempt of this step, in
        every run of the execution (a retry, a replay after a crash), and different for
        every other step of every execution. Pass it to a service that deduplicates
        requests by key, and a step that runs twice has its effect once."""
        return f"{self.execution_id}:{self.position}"


def step_info() -> StepInfo | None:
    """The step whose function calls this (sync or async, and in what it calls), or
    None outside a step's function."""
    branch = BRANCH.get()
    if not isinstance(branch, InStep):
        return None
    return StepInfo(
        branch.execution_id,
        ".".join(map(str, branch.step_position)),
        branch.name,
        branch.attempt,
    )


# The defaults are shared, and never change: their peek() and take() raise first.
BRANCH: contextvars.ContextVar[Branch] = contextvars.ContextVar(
    "loom_branch", default=_Outside()  # noqa: B039
)


def call_site(depth: int = 2) -> str:
    """``file:line`` of the body code that made the call."""
    frame = sys._getframe(depth)
    # The body's own frame, nearly always: its code and instruction fix the line, so the
    # text is made once per call site (finding a line number walks the code's line table).
    key = (frame.f_code, frame.f_lasti)
    site = _SITES.get(key)
    if site is not None:
        return site
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        "loom_runtime."
    ):
        frame = frame.f_back
    site = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
    if frame.f_code is key[0]:  # a frame of the runtime's own has callers that vary
        if len(_SITES) >= _MAX_SITES:
            _SITES.clear()  # code made at run time (exec) could make sites without end
        _SITES[key] = site
    return site


_SITES: dict[tuple[CodeType, int], str] = {}
_MAX_SITES: Final = 4096


@final
class Durable(Generic[T]):
    """A durable call with its position taken; await it once (directly or in gather)."""

    __slots__ = ("_awaited", "_coro", "_run", "position")

    def __init__(self, position: Position, coro: Coroutine[Any, Any, T], run: Run) -> None:
        self.position = position
        self._coro = coro
        self._run = run
        self._awaited = False

    def __await__(self) -> Generator[Any, None, T]:
        if self._awaited:
            raise InvalidInputError(
                f"the durable call at position {position_text(self.position)} was awaited "
                "already: a durable call is awaited once (directly or in one ctx.gather); "
                "keep its result, or make the call again for another"
            )
        self._awaited = True
        branch = BRANCH.get()
        if branch.owner is not asyncio.current_task() or branch.run is not self._run:
            # Awaited by a task the body started (asyncio.ensure_future, asyncio.wait,
            # asyncio.gather): the run could not tell when every branch waits, and would
            # park before the task's wait is listed. ctx.gather is the way. Or awaited in
            # another execution's body, whose log this call's is not.
            self._coro.close()
            branch.peek()  # raises ContextOutsideBodyError, naming where
            raise ContextOutsideBodyError(_elsewhere(branch, self._run))
        return self._watched()

    def _watched(self) -> Generator[Any, None, T]:
        try:
            return (yield from self._coro.__await__())
        except asyncio.CancelledError:
            # The run stops at the body's next call if this was not the run's own doing.
            self._run.cut(self.position)
            raise

    def close(self) -> None:
        self._coro.close()


def _elsewhere(branch: Branch, run: Run) -> Literal["other", "earlier"]:
    """Where a call made for ``run`` on another body's ``branch`` was made: in another
    execution's body, or in a later run of the same execution's."""
    current = branch.run
    if current is not None and current.execution_id == run.execution_id:
        return "earlier"
    return "other"


class _ReplayQuiet(logging.LoggerAdapter[logging.Logger]):
    """Drops records while the body is replaying what the log already holds; adds the
    execution's id and workflow name to each (``record.execution_id``,
    ``record.workflow``), for a handler to show or filter by."""

    def __init__(self, logger: logging.Logger, ctx: Context) -> None:
        super().__init__(logger, {})
        self._ctx = ctx

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 (logging's own name)
        return self.logger.isEnabledFor(level) and not self._ctx.is_replaying

    def process(
        self, msg: object, kwargs: MutableMapping[str, Any]
    ) -> tuple[object, MutableMapping[str, Any]]:
        extra = dict(kwargs.get("extra") or {})
        extra.setdefault("execution_id", self._ctx.execution_id)
        extra.setdefault("workflow", self._ctx.workflow)
        kwargs["extra"] = extra
        return msg, kwargs


@final
class Context:
    """The body's handle on its execution. Every method that touches the outside world or
    time is a durable call: recorded once, then served from the log on replay."""

    __slots__ = ("_logger", "_run")

    def __init__(self, run: Run) -> None:
        self._run = run
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None

    def _branch(self) -> Branch:
        """The line of durable calls this call is made on, if it is this body's."""
        branch = BRANCH.get()
        if branch.run is not self._run:
            branch.peek()  # outside every body, in a step: raises, naming where
            raise ContextOutsideBodyError(_elsewhere(branch, self._run))
        return branch

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger (``loom_runtime.workflow.<name>``) that is quiet while the body
        replays what the log already holds, so each line is logged once; a line after
        the last call the log holds, run again when a process that died is recovered, is
        logged again. Each record carries ``execution_id`` and ``workflow``."""
        if self._logger is None:
            self._logger = _ReplayQuiet(
                logging.getLogger(f"loom_runtime.workflow.{self._run.workflow}"), self
            )
        return self._logger

    @property
    def execution_id(self) -> str:
        return self._run.execution_id

    @property
    def workflow(self) -> str:
        return self._run.workflow

    @property
    def is_replaying(self) -> bool:
        """True while the body is making calls the log already holds: in a branch of
        ``ctx.gather``, while the log holds calls that branch (or the body past the
        gather) made after this point (and throughout a replay by the test kit's
        ``check_replay``, which runs nothing live)."""
        branch = BRANCH.get()
        return self._run.is_replaying(branch if branch.run is self._run else None)

    # Typed as fn's own call: its arguments are checked against its parameters, and the
    # step gives what fn returns (awaited, when it is async or returns an awaitable).
    @overload
    def step(
        self,
        fn: Callable[[*Args], Awaitable[T]],
        /,
        *args: *Args,
        name: str | None = None,
        retry: Retry | None = None,
        timeout: float | timedelta | None = None,
    ) -> Durable[T]: ...
    @overload
    def step(
        self,
        fn: Callable[[*Args], T],
        /,
        *args: *Args,
        name: str | None = None,
        retry: Retry | None = None,
        timeout: float | timedelta | None = None,
    ) -> Durable[T]: ...
    def step(
        self,
        fn: Callable[..., Any],
        /,
        *args: object,
        name: str | None = None,
        retry: Retry | None = None,
        timeout: float | timedelta | None = None,
    ) -> Durable[Any]:
        """Run ``fn(*args)`` at least once and record its result.

        ``fn`` may be async, or sync (it then runs in a worker thread, so it cannot stall
        the event loop); bind keyword arguments with ``functools.partial``. ``name``
        defaults to ``fn``'s qualified name and is what replay matches; ``retry`` defaults
        to one attempt. ``timeout`` (seconds or a timedelta, on the event loop's clock)
        bounds each attempt: one that runs longer fails with ``TimeoutError``, which
        ``retry`` retries as any failure (an async function is cancelled; a sync one's
        thread cannot be, and runs on with its result dropped). The result must be JSON,
        and the body gets the recorded JSON value live and on replay alike (a tuple comes
        back as a list).
        """
        if not callable(fn):
            if inspect.iscoroutine(fn):
                fn.close()  # refused: it is never awaited
                raise InvalidInputError(
                    f"ctx.step needs a function, not a coroutine ({fn!r}): pass the "
                    "function and its arguments, ctx.step(fn, *args), for the step to call"
                )
            raise InvalidInputError(f"ctx.step needs a function, not {fn!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise InvalidInputError(f"retry= must be a Retry, not {retry!r}")
        limit = None
        if timeout is not None:
            limit = seconds_of(timeout, "ctx.step(timeout=...)", endless=_NO_BOUND, positive=True)
        step_name = name if name is not None else _qualname(fn)
        if type(step_name) is not str or not step_name.isascii() or "\x00" in step_name:
            step_name = check_text(step_name, "a step name")
        elif not step_name:
            raise InvalidInputError("a step name must be a non-empty str, not ''")
        position = self._branch().take()
        site = call_site()
        run = self._run
        return Durable(position, run.step(position, step_name, fn, args, retry, site, limit), run)

    def sleep(self, duration: float | timedelta) -> Durable[None]:
        """Park for ``duration`` (seconds or a timedelta); the deadline is computed once.

        Refused (InvalidDurationError): a negative, NaN or infinite duration, one longer
        than ``MAX_DURATION`` (1000 years), one that would end after ``LATEST_DEADLINE``.
        """
        seconds = seconds_of(duration, "ctx.sleep")
        self._check_end(seconds, duration, "ctx.sleep")
        position = self._branch().take()
        site = call_site()
        return Durable(position, self._run.sleep(position, seconds, None, site), self._run)

    def sleep_until(self, when: datetime) -> Durable[None]:
        """Park until ``when`` (a timezone-aware datetime); one in the past is due at once.

        Refused (InvalidDurationError): a naive datetime, one after ``LATEST_DEADLINE``.
        """
        offset = when.utcoffset() if isinstance(when, datetime) else None
        if offset is None:
            raise InvalidDurationError(
                f"ctx.sleep_until needs a timezone-aware datetime, not {when!r}; "
                "use datetime.now(UTC) + ... or attach tzinfo"
            )
        try:
            deadline = when.astimezone(UTC)
        except OverflowError:
            # In UTC it falls outside what a datetime holds: before its first instant (long
            # past, so due at once: that instant serves) or after its last (refused below).
            deadline = (datetime.min if offset > timedelta(0) else datetime.max).replace(
                tzinfo=UTC
            )
        if deadline > LATEST_DEADLINE:
            raise InvalidDurationError(
                f"ctx.sleep_until({when!r}) is after {LATEST_DEADLINE.isoformat()}, the "
                "latest deadline the runtime keeps; to wait without end, use "
                "ctx.receive(topic) with no timeout"
            )
        position = self._branch().take()
        site = call_site()
        return Durable(position, self._run.sleep(position, None, deadline, site), self._run)

    def receive(
        self, topic: str, *, timeout: float | timedelta | None = None
    ) -> Durable[JsonValue]:
        """The next message sent on ``topic``, exactly once; ``None`` when ``timeout``
        (seconds or a timedelta) passes first."""
        topic = check_text(topic, "a topic")
        seconds = self._timeout(timeout, "ctx.receive(timeout=...)")
        position = self._branch().take()
        site = call_site()
        run = self._run
        return Durable(position, run.receive(position, "receive", (topic,), seconds, site), run)

    def receive_any(
        self, *topics: str, timeout: float | timedelta | None = None
    ) -> Durable[Received | None]:
        """The oldest message sent on any of ``topics``, exactly once, as a
        :class:`Received` (``topic, value``); ``None`` when ``timeout`` passes first.
        Messages on the other topics stay in the inbox for a later receive."""
        if not topics:
            raise InvalidInputError(
                "ctx.receive_any() needs at least one topic: name the topics to wait on, "
                "as in ctx.receive_any('approve', 'reject')"
            )
        for topic in topics:
            if isinstance(topic, list | tuple | set | frozenset):
                raise InvalidInputError(
                    f"ctx.receive_any() takes each topic as its own argument, not {topic!r}; "
                    "write ctx.receive_any('approve', 'reject'), or unpack a list with *"
                )
        checked = tuple(check_text(topic, "a topic") for topic in topics)
        if len(set(checked)) != len(checked):
            twice = next(t for t in checked if checked.count(t) > 1)
            raise InvalidInputError(
                f"ctx.receive_any() names the topic {twice!r} more than once; name each "
                "topic once"
            )
        seconds = self._timeout(timeout, "ctx.receive_any(timeout=...)")
        position = self._branch().take()
        site = call_site()
        run = self._run
        return Durable(position, run.receive(position, "receive_any", checked, seconds, site), run)

    def _timeout(self, timeout: object, what: str) -> float | None:
        """A receive's ``timeout=`` in seconds, checked; None for none."""
        if timeout is None:
            return None
        seconds = seconds_of(timeout, what, endless=_NO_TIMEOUT)
        self._check_end(seconds, timeout, what)
        return seconds

    def _check_end(self, seconds: float, duration: object, what: str) -> None:
        check_end(
            seconds, duration, what, self._run.app.clock.now(),
            "wait less, or use ctx.receive(topic) with no timeout to wait without end",
        )

    @overload
    async def gather(self, a: Awaitable[T1], /) -> tuple[T1]: ...
    @overload
    async def gather(self, a: Awaitable[T1], b: Awaitable[T2], /) -> tuple[T1, T2]: ...
    @overload
    async def gather(
        self, a: Awaitable[T1], b: Awaitable[T2], c: Awaitable[T3], /
    ) -> tuple[T1, T2, T3]: ...
    @overload
    async def gather(
        self, a: Awaitable[T1], b: Awaitable[T2], c: Awaitable[T3], d: Awaitable[T4], /
    ) -> tuple[T1, T2, T3, T4]: ...
    @overload
    async def gather(self, *aws: Awaitable[T]) -> tuple[T, ...]: ...
    async def gather(self, *aws: Awaitable[Any]) -> tuple[Any, ...]:
        """Await durable calls (or coroutines that make them) concurrently.

        Positions follow the order the calls were made, never the order they finished, so
        a replay on another node sees the same log. Every branch runs to its end; then the
        first failure in argument order is raised, or the results are returned in order.
        """
        for aw in aws:
            if not inspect.isawaitable(aw):
                raise InvalidInputError(f"ctx.gather takes awaitables, not {aw!r}")
        position = self._branch().take()
        return await self._run.gather(position, aws, call_site())

    def set_event(self, key: str, value: object) -> Durable[None]:
        """Publish ``value`` under ``key`` for code outside the workflow to read with
        ``app.get_event(execution_id, key)``: written when awaited, before the body goes
        on; a later ``set_event`` of the key replaces it. Refused before anything is
        written: a key that is not a non-empty str, a value that is not JSON."""
        key = check_text(key, "an event key")
        checked = json_value(value, f"the value of event {key!r}")
        position = self._branch().take()
        site = call_site()
        return Durable(position, self._run.set_event(position, key, checked, site), self._run)

    def now(self) -> datetime:
        """The current time (UTC), recorded so replay sees the same value."""
        position = self._branch().take()
        raw = self._run.value(position, "now", call_site(), lambda: self._run.clock_now())
        assert isinstance(raw, str)
        return datetime.fromisoformat(raw)

    def random(self) -> float:
        """A float in [0, 1), recorded so replay sees the same value."""
        position = self._branch().take()
        raw = self._run.value(position, "random", call_site(), self._run.draw_random)
        assert isinstance(raw, float | int)
        return float(raw)

    def uuid(self) -> uuid_module.UUID:
        """A random UUID (version 4), recorded so replay sees the same value."""
        position = self._branch().take()
        raw = self._run.value(position, "uuid", call_site(), self._run.draw_uuid)
        assert isinstance(raw, str)
        return uuid_module.UUID(raw)

    def patched(self, name: str) -> bool:
        """True in executions that reach this point with the new code, False in those that
        recorded this stretch with the old: the way to change code under running
        executions (``if ctx.patched("x"): new path else: old path``)."""
        name = check_text(name, "a patch name")
        return self._run.patched(self._branch(), name, call_site())

    def deprecate_patch(self, name: str) -> None:
        """Retire ``ctx.patched(name)`` once no execution runs the old path: put this where
        the ``if`` was, keep only the new path. An execution that recorded the patch's
        marker replays past it; one that did not records nothing here. Remove the call
        once no execution that recorded the marker is left (see docs/runtime.md,
        "Changing code under running executions")."""
        name = check_text(name, "a patch name")
        self._run.deprecate_patch(self._branch(), name)

    def continue_as_new(self, *args: object) -> NoReturn:
        """End this execution and start a fresh one of the same workflow with ``args``
        (EXECUTION_CONTINUED names it); the handle's result follows the chain. Arguments
        that are not JSON, or more or fewer than the body takes, are refused here
        (NotJsonError, InvalidInputError), as ``app.start`` refuses them. Like every
        durable call, it is refused where replay would not make it (ContextOutsideBodyError:
        in a step's function, a task the body started, or after the body ended)."""
        self._branch().peek()
        json_arguments(args, "the input of the successor")
        self._run.app.check_arguments(self._run.workflow, len(args), "ctx.continue_as_new")
        raise ContinueAsNew(args)


class ContinueAsNew(BaseException):
    """Unwinds the body for continue-as-new; a BaseException so ``except Exception`` in the
    body cannot swallow it."""

    def __init__(self, args: tuple[object, ...]) -> None:
        super().__init__()
        self.args_ = args


def _qualname(fn: object) -> str:
    """A step's default name: its function's qualified name, without the module (moving
    a function to another module, or running its module as a script, keeps its steps'
    names); a ``functools.partial`` is named by the function it binds."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    for attribute in ("__qualname__", "__name__"):
        name = getattr(fn, attribute, None)
        if isinstance(name, str) and name:
            return name
    return type(fn).__qualname__


_MAX_SECONDS: Final = MAX_DURATION.total_seconds()


_ENDLESS: Final = "use ctx.receive(topic) with no timeout to wait without end"
_NO_TIMEOUT: Final = "leave timeout= out to wait without end"
_NO_BOUND: Final = "leave timeout= out for no bound"


def check_end(seconds: float, duration: object, what: str, now: datetime, instead: str) -> None:
    """Refuse a wait of ``seconds`` that, from ``now`` (the app's clock's), would end after
    LATEST_DEADLINE (a deadline computed from it would overflow, or come close); the
    refusal ends with ``instead``: what to write instead."""
    if seconds > (LATEST_DEADLINE - now).total_seconds():
        raise InvalidDurationError(
            f"{what} of {shown(duration)} from now ({now.isoformat()}, the app's clock) "
            f"would end after {LATEST_DEADLINE.isoformat()}, the latest deadline the "
            f"runtime keeps; {instead}"
        )


def seconds_of(
    duration: object, what: str, *, endless: str = _ENDLESS, positive: bool = False
) -> float:
    """``duration`` (seconds or a timedelta) in seconds. Refused: a bool, NaN, a negative
    duration (0 too when ``positive``), and one longer than MAX_DURATION (an infinity, an
    int of any size, compared as it is, never converted to a float that would overflow),
    whose refusal ends with ``endless``: what to write for no end instead."""
    amount: float
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        amount = duration
    elif isinstance(duration, timedelta):
        amount = duration.total_seconds()
    else:
        raise InvalidDurationError(
            f"{what} takes seconds (int or float) or a timedelta, not {duration!r}"
        )
    if amount != amount:  # NaN
        raise InvalidDurationError(f"{what} needs a number of seconds, not {duration!r}")
    if positive and amount <= 0:
        raise InvalidDurationError(
            f"{what} needs a duration of more than 0 seconds, not {shown(duration)}; "
            f"{endless}"
        )
    if amount < 0:
        raise InvalidDurationError(f"{what} needs a duration >= 0, not {shown(duration)}")
    if amount > _MAX_SECONDS:
        raise InvalidDurationError(
            f"{what} takes at most {_MAX_SECONDS:.0f} seconds (MAX_DURATION, 1000 years), "
            f"not {shown(duration)}; check the unit (seconds), or {endless}"
        )
    return float(amount)
