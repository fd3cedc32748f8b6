"""Loom runtime: durable workflows whose steps are served from the log on replay.

::

    from loom_runtime import Context, Loom, Retry

    app = Loom("sqlite:///orders.db")

    @app.workflow()
    async def checkout(ctx: Context, order_id: str) -> dict[str, object]:
        card = await ctx.step(charge_card, order_id, retry=Retry(attempts=5))
        await ctx.sleep(30)
        return {"card": card}

    async with app:
        handle = await app.start(checkout, "o-42", id="order-42")
        print(await handle.result())
"""

from loom_core import (
    ConflictError,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    LoomError,
    StorageError,
)
from loom_runtime.app import MAX_NEW_ID_BYTES, MAX_RECOVERIES, Authorize, Handle, Loom
from loom_runtime.clock import Clock, RandomSource, SystemClock
from loom_runtime.context import Context, Durable, Received, StepInfo, step_info
from loom_runtime.errors import (
    ActionDeniedError,
    AppNotRunningError,
    ContextOutsideBodyError,
    DurableCallCancelledError,
    ExecutionCancelledError,
    ExecutionTimedOutError,
    InvalidDurationError,
    LogFormatError,
    NotJsonError,
    OtherEventLoopError,
    RecoveryLimitError,
    RedriveExhaustedError,
    ReplayDivergedError,
    ReservedExecutionIdError,
    ResultTimeoutError,
    ResumeContendedError,
    ResumeRefusedError,
    RunStoppedError,
    StepFailedError,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from loom_runtime.fold import Status, View, fold
from loom_runtime.records import execution_subject
from loom_runtime.retry import Retry
from loom_runtime.schedules import Schedule
from loom_runtime.timers import TimerService

__version__ = "0.1.0"

__all__ = [
    "MAX_NEW_ID_BYTES",
    "MAX_RECOVERIES",
    "ActionDeniedError",
    "AppNotRunningError",
    "Authorize",
    "Clock",
    "ConflictError",
    "Context",
    "ContextOutsideBodyError",
    "DurableCallCancelledError",
    "Durable",
    "ExecutionAlreadyExistsError",
    "ExecutionCancelledError",
    "ExecutionNotFoundError",
    "ExecutionTimedOutError",
    "Handle",
    "InvalidDurationError",
    "InvalidExecutionIdError",
    "InvalidInputError",
    "InvalidOptionError",
    "LogFormatError",
    "Loom",
    "LoomError",
    "NotJsonError",
    "OtherEventLoopError",
    "RandomSource",
    "Received",
    "RecoveryLimitError",
    "RedriveExhaustedError",
    "ReplayDivergedError",
    "ReservedExecutionIdError",
    "ResultTimeoutError",
    "ResumeContendedError",
    "ResumeRefusedError",
    "Retry",
    "RunStoppedError",
    "Schedule",
    "Status",
    "StorageError",
    "StepFailedError",
    "StepInfo",
    "SystemClock",
    "TimerService",
    "View",
    "WorkflowFailedError",
    "WorkflowNotFoundError",
    "__version__",
    "execution_subject",
    "fold",
    "step_info",
]
