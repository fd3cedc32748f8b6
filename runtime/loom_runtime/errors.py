"""The errors the runtime raises, all in the :class:`~loom_core.errors.LoomError` tree.

The tree (the kernel's errors are drawn in :mod:`loom_core.errors`)::

    LoomError
    ├── InvalidInputError (ValueError)
    │   ├── NotJsonError                   an input, result or message that is not JSON
    │   ├── InvalidDurationError           a negative sleep, a naive datetime, a bad timeout
    │   └── ReservedExecutionIdError       an id the runtime keeps for itself ("$...")
    ├── WorkflowNotFoundError (LookupError)  no workflow of that name on this app
    ├── ResumeRefusedError                 .reason: the park cannot be answered; final
    ├── ResumeContendedError               .retryable = True: rivals kept taking the fence
    ├── ActionDeniedError (PermissionError)  the authorize hook said no (recorded in the log)
    ├── ReplayDivergedError                the code no longer matches the log
    ├── StepFailedError                    a step's last attempt failed (raised into the body)
    ├── WorkflowFailedError                handle.result() of a failed execution
    ├── ExecutionCancelledError            handle.result() of a cancelled execution
    │   └── ExecutionTimedOutError         ... cancelled because its deadline passed
    ├── ResultTimeoutError (TimeoutError)  handle.result(timeout=...) ran out
    ├── RedriveExhaustedError              a contended timer wake gave up; recover() it
    ├── RecoveryLimitError                 recovered too often in a row with nothing written
    ├── RunStoppedError                    a body raised a BaseException: nothing recorded
    │   └── DurableCallCancelledError      ... or went on past a durable call it cancelled
    ├── AppNotRunningError                 a call that needs ``async with app`` outside it
    │   └── OtherEventLoopError (RuntimeError)  ... made in another event loop than the app's
    ├── ContextOutsideBodyError (RuntimeError)  a ctx call in a step, a task, or after the body
    └── LogFormatError                     a runtime event without the shape it must have,
                                           or a kernel kind a newer loom-runtime wrote

:class:`ResumeContendedError` is deliberately not a :class:`ResumeRefusedError`: a caller
that treats every refusal as final must not mistake "retry me" for "refused".
"""

from __future__ import annotations

from typing import Final, Literal

from loom_core import InvalidInputError, LoomError

__all__ = [
    "ActionDeniedError",
    "AppNotRunningError",
    "ContextOutsideBodyError",
    "DurableCallCancelledError",
    "ExecutionCancelledError",
    "ExecutionTimedOutError",
    "InvalidDurationError",
    "LogFormatError",
    "NotJsonError",
    "OtherEventLoopError",
    "RedriveExhaustedError",
    "RecoveryLimitError",
    "ReplayDivergedError",
    "ReservedExecutionIdError",
    "ResultTimeoutError",
    "ResumeContendedError",
    "ResumeRefusedError",
    "RunStoppedError",
    "StepFailedError",
    "WorkflowFailedError",
    "WorkflowNotFoundError",
]


class NotJsonError(InvalidInputError):
    """A value the runtime must record is not JSON (``where`` says which)."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        super().__init__(
            f"{where} is not JSON: {reason}; pass dicts, lists, str, int, float, bool or "
            "None (convert dataclasses and datetimes yourself)"
        )


class InvalidDurationError(InvalidInputError):
    """A sleep, deadline or timeout the runtime cannot honour."""


class ReservedExecutionIdError(InvalidInputError):
    """An id the runtime keeps for itself: one starting with ``$`` (its inbox streams),
    or, for a new execution, one ending in ``#`` and digits (the name of a successor
    that ``continue_as_new`` creates)."""

    def __init__(self, execution_id: str, *, successor: bool = False) -> None:
        self.execution_id = execution_id
        if successor:
            base = execution_id[: execution_id.rindex("#")]
            reason = (
                f"ends in '#' and a number, the form of the ids continue_as_new gives "
                f"successors ({base!r} continues as {base + '#1'!r}, then "
                f"{base + '#2'!r}...); choose another id, e.g. with '-' for '#'"
            )
        else:
            reason = (
                "starts with '$', which the runtime reserves for its own streams; choose "
                "another id"
            )
        super().__init__(f"execution id {execution_id!r} {reason}")


class WorkflowNotFoundError(LoomError, LookupError):
    """The log names a workflow this app has not registered."""

    def __init__(
        self,
        name: str,
        execution_id: str | None = None,
        known: tuple[str, ...] = (),
        *,
        todo: str = "register it with @app.workflow(name=...) before starting or resuming",
    ) -> None:
        self.name = name
        self.known = known
        self.execution_id = execution_id
        super().__init__(
            f"no workflow named {name!r} is registered on this app"
            + (f" (execution {execution_id!r} needs it)" if execution_id else "")
            + (f"; registered: {', '.join(known)}" if known else "")
            + f"; {todo}"
        )


ResumeRefusal = Literal["not-suspended", "nothing-to-answer"]


class ResumeRefusedError(LoomError):
    """The park cannot be answered; nothing was appended and no token was taken.

    ``reason`` is ``"not-suspended"`` (the park is answered, gone, or not a park at that
    sequence; an execution that has finished or continued is one, and the message names
    its status) or ``"nothing-to-answer"`` (it waits only for messages and none is there).
    """

    def __init__(self, execution_id: str, reason: ResumeRefusal, detail: str = "") -> None:
        self.execution_id = execution_id
        self.reason: ResumeRefusal = reason
        super().__init__(
            f"cannot resume {execution_id!r}: {reason}" + (f" ({detail})" if detail else "")
        )


class ResumeContendedError(LoomError):
    """Rivals kept taking the fence while the park stayed unanswered; retry later."""

    retryable: Final = True

    def __init__(self, execution_id: str, attempts: int) -> None:
        self.execution_id = execution_id
        self.attempts = attempts
        super().__init__(
            f"resume of {execution_id!r} was contended {attempts} times: another node keeps "
            "taking the fence while the park stays unanswered; retry later (the timer "
            "service does, with backoff)"
        )


class ActionDeniedError(LoomError, PermissionError):
    """The authorize hook refused ``action``; an EXECUTION_DENIED records it."""

    def __init__(self, execution_id: str, action: str, principal: object) -> None:
        self.execution_id = execution_id
        self.action = action
        self.principal = principal
        super().__init__(f"{shown_safely(principal)} may not {action} {execution_id!r}")


def shown_safely(value: object) -> str:
    """``repr(value)``, or what it is when its repr fails (an int of more digits than
    Python converts, a ``__repr__`` that raises): a principal is the caller's object."""
    try:
        return repr(value)
    except Exception as exc:
        return f"<a {type(value).__qualname__} whose repr() raised {type(exc).__name__}>"


class ReplayDivergedError(LoomError):
    """The body no longer makes the calls its log recorded; nothing was appended.

    ``recorded`` and ``attempted`` describe the two calls (``None`` when one side has no
    call at ``position``), each with its call site. Fix the code (``ctx.patched`` is the
    way to change code under running executions), then resume or cancel the execution.
    """

    def __init__(
        self,
        execution_id: str,
        position: str,
        recorded: str | None,
        attempted: str | None,
    ) -> None:
        self.execution_id = execution_id
        self.position = position
        self.recorded = recorded
        self.attempted = attempted
        super().__init__(
            f"replay of {execution_id!r} diverged at position {position}: the log recorded "
            f"{recorded or 'no call'}, the code now makes {attempted or 'no call'}; the "
            "replay appended nothing: fix the code (guard changes with ctx.patched) and "
            "carry the execution on (docs/runtime.md, \"Replay and positions\"), or cancel it"
        )


class StepFailedError(LoomError):
    """A step's last attempt raised; recorded as STEP_FAILED and replayed identically."""

    def __init__(
        self, step: str, position: str, attempts: int, error_type: str, error_message: str
    ) -> None:
        self.step = step
        self.position = position
        self.attempts = attempts
        self.error_type = error_type
        self.error_message = error_message
        super().__init__(
            f"step {step!r} at position {position} failed after {attempts} attempt"
            f"{'s' if attempts != 1 else ''}: {error_type}: {error_message}"
        )


class WorkflowFailedError(LoomError):
    """The execution ended with EXECUTION_FAILED."""

    def __init__(self, execution_id: str, error_type: str, error_message: str) -> None:
        self.execution_id = execution_id
        self.error_type = error_type
        self.error_message = error_message
        super().__init__(f"execution {execution_id!r} failed: {error_type}: {error_message}")


class ExecutionCancelledError(LoomError):
    """The execution ended with EXECUTION_CANCELLED."""

    def __init__(self, execution_id: str, reason: str | None) -> None:
        self.execution_id = execution_id
        self.reason = reason
        super().__init__(
            f"execution {execution_id!r} was cancelled" + (f": {reason}" if reason else "")
        )


class ExecutionTimedOutError(ExecutionCancelledError):
    """The execution was cancelled because its deadline (``timeout=`` at its start)
    passed before it ended."""


class ResultTimeoutError(LoomError, TimeoutError):
    """``handle.result(timeout=...)`` gave up waiting; the execution goes on."""

    def __init__(self, execution_id: str, timeout: float, status: str, hint: str = "") -> None:
        self.execution_id = execution_id
        self.timeout = timeout
        self.status = status
        super().__init__(
            f"execution {execution_id!r} did not finish within {timeout}s (it is {status}); "
            "it goes on: wait again, or look at it with handle.status()"
            + (f"; {hint}" if hint else "")
        )


class RedriveExhaustedError(LoomError):
    """A contended timer wake was retried ``attempts`` times; the row is retired."""

    def __init__(self, execution_id: str, attempts: int) -> None:
        self.execution_id = execution_id
        self.attempts = attempts
        super().__init__(
            f"gave up waking {execution_id!r} after {attempts} contended attempts; the timer "
            "row is retired and the park is still unanswered: resume it by hand "
            "(app.resume(..., fence_if_parked_at=...)) once the contention is gone"
        )


class RecoveryLimitError(LoomError):
    """An execution was recovered ``recoveries`` times in a row without its run writing
    anything; its recovery fails it instead (the workflow's ``max_recoveries``)."""

    def __init__(self, execution_id: str, recoveries: int) -> None:
        self.execution_id = execution_id
        self.recoveries = recoveries
        super().__init__(
            f"execution {execution_id!r} was recovered {recoveries} times in a row by the "
            "same code and its run wrote nothing after each takeover: either its body kills "
            "its process at the same point (a crash, an exit, memory), or its replay "
            "diverged from the log each time (the starts before this one reported "
            "ReplayDivergedError to on_error); it is failed rather than run again: fix the "
            "code, then app.fork it to run it again from its log"
        )


class ContextOutsideBodyError(LoomError, RuntimeError):
    """A durable call through a ``ctx`` outside the workflow body it was handed to:
    ``where`` is ``"outside"`` (a ``ctx`` kept after its body ended, or used by code no
    body runs), ``"step"`` (inside a step's function), ``"task"`` (made or awaited in a task
    or thread the body started itself, rather than through ``ctx.gather``), ``"other"``
    (in the body of another execution) or ``"earlier"`` (a ``ctx`` kept from an earlier
    run of the same execution, one that parked or died)."""

    def __init__(
        self, where: Literal["outside", "step", "task", "other", "earlier"] = "outside"
    ) -> None:
        self.where = where
        super().__init__(_OUTSIDE[where])


_OUTSIDE: Final = {
    "outside": (
        "a ctx call was made outside its workflow's body (a ctx kept after the body "
        "ended, or used by code the body does not await): make durable calls from the "
        "body, or from coroutines it awaits or passes to ctx.gather"
    ),
    "step": (
        "a ctx call was made inside a step: a step is plain code that runs at least once, "
        "and a durable call it made would be recorded at a position no replay makes (a "
        "replay serves the step's result without running it); make durable calls in the "
        "body, between steps"
    ),
    "task": (
        "a ctx call was made, or awaited, in a task or thread the body started itself "
        "(asyncio.create_task or ensure_future, asyncio.wait or gather, a timeout that "
        "runs its awaitable in a task of its own): the run cannot tell when such a task "
        "waits, its calls' positions would depend on the order the tasks happen to run "
        "in, and it can outlive the body; run concurrent durable calls through ctx.gather"
    ),
    "earlier": (
        "a ctx call was made through a ctx kept from an earlier run of this execution's "
        "body (each run gets a ctx of its own, and the body runs again from the top after "
        "a park, a resume or a recovery): make durable calls through the ctx the body is "
        "given in this run, passing it down rather than keeping it between runs"
    ),
    "other": (
        "a ctx call was made in the body of another execution, through a ctx kept from "
        "the execution it was handed to: it would be recorded in that execution's log, at "
        "a position its own replay does not make; each body makes its durable calls "
        "through the ctx it is given"
    ),
}


class RunStoppedError(LoomError):
    """A run stopped without recording how its body ended, because the body (or a step
    it awaited) raised a ``BaseException`` that is not an ``Exception``
    (``KeyboardInterrupt`` and ``SystemExit`` excepted: they end the process). The
    execution stays ``running``, as after a crash; this node's next start, or
    ``app.recover()``, carries it on. Reported to ``on_error``; ``__cause__`` is what was
    raised."""

    def __init__(self, execution_id: str, raised: BaseException) -> None:
        self.execution_id = execution_id
        super().__init__(
            f"the run of {execution_id!r} stopped: its body raised {type(raised).__name__}, a "
            "BaseException that is not an Exception, so nothing was recorded and the "
            "execution stays running as after a crash; this node's next start, or "
            "app.recover(), carries it on. Raise an Exception to fail the execution"
        )


class DurableCallCancelledError(RunStoppedError):
    """A run stopped without writing anything more because a durable call of its body was
    cancelled by the body's own code (``asyncio.timeout``, ``asyncio.wait_for``, a
    ``TaskGroup`` that cancelled the body, a ``CancelledError`` caught) and the body went
    on: a replay makes that call again, where this run went on without it, so what the
    body does next is not what a replay would do. The execution stays ``running``, as
    after a crash; ``position`` is the call's, written with dots."""

    def __init__(self, execution_id: str, position: str) -> None:
        self.execution_id = execution_id
        self.position = position
        LoomError.__init__(
            self,
            f"the run of {execution_id!r} stopped: the durable call at position {position} "
            "was cancelled by the body's own code (asyncio.timeout or wait_for around it, "
            "a TaskGroup, a CancelledError caught) and the body went on, which a replay, "
            "making that call again, would not; nothing more was recorded and the "
            "execution stays running as after a crash. Bound a step with ctx.step(..., "
            "timeout=...) and a wait with ctx.receive(topic, timeout=...), then carry the "
            "execution on (app.recover())",
        )


class AppNotRunningError(LoomError):
    """The call needs the app's storage and worker: use it inside ``async with app``."""

    def __init__(self, what: str, *, left: bool = False) -> None:
        if left:
            super().__init__(
                f"{what} was cut short: the app was left, which stops every run of this "
                "process where it is; an execution left running is carried on by the "
                "node's next start"
            )
        else:
            super().__init__(f"{what} needs a running app: call it inside 'async with app:'")


class OtherEventLoopError(AppNotRunningError, RuntimeError):
    """A call made in another event loop (another thread, or a loop of its own) than the
    one the app was entered in: the app's tasks, futures and storage belong to that loop,
    and a call from elsewhere would corrupt them. Refused before anything is written."""

    def __init__(self, what: str, *, closed: bool = False) -> None:
        if closed:
            LoomError.__init__(
                self,
                f"{what} was called in another event loop than the app's, and the app's "
                "loop is closed without the app having been left: leave 'async with app:' "
                "in the loop that entered it (a test fixture that enters the app must use "
                "the test's event loop)",
            )
        else:
            LoomError.__init__(
                self,
                f"{what} was called in another event loop than the one the app runs in: "
                "from another thread, hand the call to the app's loop with "
                "asyncio.run_coroutine_threadsafe(app.start(...), loop) and wait for its "
                "result there",
            )


class LogFormatError(LoomError):
    """An event of a runtime kind lacks the shape docs/runtime.md gives it, or is of a
    kernel kind a newer loom-runtime wrote, which this one cannot read (``remedy`` then
    says to upgrade)."""

    def __init__(
        self,
        execution_id: str,
        sequence: int,
        kind: str,
        detail: str,
        *,
        remedy: str = "was it written by something other than loom-runtime?",
    ) -> None:
        self.execution_id = execution_id
        self.sequence = sequence
        self.kind = kind
        super().__init__(
            f"event {sequence} ({kind}) of {execution_id!r} is not a runtime record: {detail}; "
            f"{remedy}"
        )
