"""Bodies that use the ctx API, or asyncio, the way it was not meant: what they see live,
and that a replay of what they recorded sees the same (docs/runtime.md, "The workflow
body")."""

from __future__ import annotations

import asyncio
import functools
import gc
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import pytest
from loom_runtime import (
    Context,
    ContextOutsideBodyError,
    Durable,
    DurableCallCancelledError,
    Loom,
    StepFailedError,
    WorkflowFailedError,
)
from loom_runtime.testing import VirtualClock, check_replay

from loom_core import EventKind, InvalidOptionError


async def kinds(app: Loom, execution_id: str) -> list[str]:
    return [e.kind for e in await app.storage.events.read(execution_id)]


@pytest.fixture
async def unretrieved() -> AsyncIterator[list[dict[str, Any]]]:
    """What the running loop's exception handler is handed (a task freed with an
    exception nobody retrieved, asyncio logs as an error), collected for the test."""
    loop = asyncio.get_running_loop()
    handled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: handled.append(context))
    yield handled
    loop.set_exception_handler(previous)


async def fail(tag: str) -> None:
    raise ValueError(f"failed {tag}")


async def echo(value: object) -> object:
    return value


# -- ctx.gather ------------------------------------------------------------------------------


async def test_a_gather_that_ends_on_one_branch_takes_every_other_branchs_failure(
    app: Loom, unretrieved: list[dict[str, Any]]
) -> None:
    """A branch that continues as new, or a second failure behind the first in argument
    order, leaves no branch's exception unretrieved: asyncio logs nothing as an error
    when the gather's tasks are freed."""

    async def goes_on(ctx: Context, generation: int) -> None:
        await ctx.step(echo, generation)
        ctx.continue_as_new(generation + 1)

    @app.workflow()
    async def continues(ctx: Context, generation: int) -> object:
        if generation:
            return generation
        return await ctx.gather(goes_on(ctx, generation), ctx.step(fail, "behind"))

    @app.workflow()
    async def fails_twice(ctx: Context) -> object:
        try:
            await ctx.gather(ctx.step(fail, "first"), ctx.step(fail, "second"))
        except StepFailedError as exc:
            return exc.error_message
        return None

    assert await app.execute(continues, 0, id="c") == 1
    assert await app.execute(fails_twice, id="f") == "failed first"
    gc.collect()
    assert [context["message"] for context in unretrieved] == []
    assert await kinds(app, "c") == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.STEP_FAILED,
        EventKind.EXECUTION_CONTINUED,
    ]
    assert sorted(await check_replay(app)) == ["c", "c#1", "f"]
    gc.collect()
    assert [context["message"] for context in unretrieved] == []


# -- how a failure is recorded ---------------------------------------------------------------


async def test_an_exception_groups_recorded_message_names_each_of_its_exceptions(
    app: Loom,
) -> None:
    """A TaskGroup in the body whose task makes a durable call fails the execution with
    an ExceptionGroup; its recorded message says what was refused and what to do (it said
    only "unhandled errors in a TaskGroup (1 sub-exception)"). A step that raises a group
    is recorded so too, live as on replay; groups nest, and past ten only a count is
    given."""

    async def charge() -> str:
        return "charged"

    async def grouped() -> None:
        nested = ExceptionGroup("inner", [KeyError("k")])
        raise ExceptionGroup("outer", [ValueError("v"), nested])

    async def many() -> None:
        raise ExceptionGroup("many", [ValueError(str(k)) for k in range(12)])

    @app.workflow()
    async def spawns(ctx: Context) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(helper(ctx))

    async def helper(ctx: Context) -> object:
        return await ctx.step(charge)

    @app.workflow()
    async def steps(ctx: Context) -> list[str]:
        said: list[str] = []
        for fn in (grouped, many):
            try:
                await ctx.step(fn)
            except StepFailedError as exc:
                said.append(exc.error_message)
        return said

    with pytest.raises(WorkflowFailedError) as failed:
        await app.execute(spawns, id="tg")
    assert failed.value.error_type == "ExceptionGroup"
    assert failed.value.error_message.startswith(
        "unhandled errors in a TaskGroup (1 sub-exception): "
        "loom_runtime.errors.ContextOutsideBodyError: a ctx call was made, or awaited, in "
        "a task or thread the body started itself"
    )
    assert "run concurrent durable calls through ctx.gather" in failed.value.error_message
    assert await app.execute(steps, id="s") == [
        "outer (2 sub-exceptions): ValueError: v; "
        "ExceptionGroup: inner (1 sub-exception): KeyError: 'k'",
        "many (12 sub-exceptions): "
        + "; ".join(f"ValueError: {k}" for k in range(10))
        + "; and 2 more",
    ]
    assert sorted(await check_replay(app)) == ["s", "tg"]


# -- what a body or a step forgot to await -----------------------------------------------------


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
async def test_a_result_left_unawaited_is_refused_saying_to_await_it(app: Loom) -> None:
    """A body that returns a durable call, or a step that returns a coroutine, without
    awaiting it fails with NotJsonError saying to put ``await`` before it (it said only
    what JSON is); live as on replay."""

    async def inner() -> str:
        return "inner"

    made: list[Coroutine[Any, Any, str]] = []

    async def forgets() -> object:
        made.append(inner())
        return made[-1]

    @app.workflow()
    async def returns_call(ctx: Context) -> object:
        return ctx.step(echo, "never run")

    @app.workflow()
    async def step_returns_coroutine(ctx: Context) -> object:
        try:
            return await ctx.step(forgets)
        except StepFailedError as exc:
            return [exc.error_type, exc.error_message]

    with pytest.raises(WorkflowFailedError) as failed:
        await app.execute(returns_call, id="r")
    assert failed.value.error_type == "loom_runtime.errors.NotJsonError"
    assert "a Durable (" in failed.value.error_message
    assert "which nothing awaited: put await before it" in failed.value.error_message
    said = await app.execute(step_returns_coroutine, id="s")
    assert isinstance(said, list)
    error_type, message = said
    assert error_type == "loom_runtime.errors.NotJsonError"
    assert "a coroutine (" in message
    assert "which nothing awaited: put await before it" in message
    assert await kinds(app, "r") == [EventKind.EXECUTION_STARTED, EventKind.EXECUTION_FAILED]
    assert sorted(await check_replay(app)) == ["r", "s"]
    made[0].close()  # the test's own leftover, not one of the runtime's


# -- a durable call the body's own code cancelled ---------------------------------------------


async def test_a_body_that_goes_on_past_a_call_its_timeout_cancelled_stops_writing_nothing(
    app: Loom,
) -> None:
    """``asyncio.timeout`` around a step cancels it unrecorded; a body that catches the
    TimeoutError and goes on would record its next calls where a replay, making the step
    again, does not (it ran the next step and completed, and no replay matched). The run
    stops instead, before any other call or write, with DurableCallCancelledError; once
    the step no longer outlasts the timeout, a recovery carries the execution on."""
    release = asyncio.Event()
    ran: list[str] = []

    async def slow() -> str:
        ran.append("slow")
        await release.wait()  # never set in the first run: the timeout always fires first
        return "slow"

    async def after() -> str:
        ran.append("after")
        return "after"

    @app.workflow()
    async def bounded(ctx: Context) -> list[object]:
        said: list[object] = []
        try:
            async with asyncio.timeout(0.01):
                said.append(await ctx.step(slow))
        except TimeoutError:
            said.append("timed out")
        said.append(await ctx.step(after))
        return said

    handle = await app.start(bounded, id="b")
    with pytest.raises(DurableCallCancelledError) as stopped:
        await handle.result(timeout=5)
    assert stopped.value.position == "0"
    assert "ctx.step(..., timeout=...)" in str(stopped.value)
    assert app.reported == [stopped.value]  # type: ignore[attr-defined]
    assert ran == ["slow"]
    assert await kinds(app, "b") == [EventKind.EXECUTION_STARTED]
    assert await handle.status() == "running"
    assert await check_replay(app) == ["b"]

    release.set()
    await app.recover()
    assert await handle.result(timeout=5) == ["slow", "after"]
    assert ran == ["slow", "slow", "after"]
    assert await check_replay(app) == ["b"]
    app.reported.clear()  # type: ignore[attr-defined]


async def test_a_gather_its_timeout_cancelled_stops_the_run_at_the_next_call(
    app: Loom,
) -> None:
    """A gather cancelled by the body's timeout while one branch waits for a message and
    another runs a step: the body's next call stops the run, and nothing the cancelled
    branches did, nor a park, is written."""
    ran: list[str] = []

    async def hold() -> str:
        ran.append("hold")
        await asyncio.Event().wait()
        return "held"

    @app.workflow()
    async def races(ctx: Context) -> object:
        try:
            async with asyncio.timeout(0.01):
                await ctx.gather(ctx.receive("go"), ctx.step(hold))
        except TimeoutError:
            pass
        return await ctx.step(echo, "after")

    handle = await app.start(races, id="g")
    with pytest.raises(DurableCallCancelledError) as stopped:
        await handle.result(timeout=5)
    assert stopped.value.position == "2"  # the gather's: its calls took 0 and 1
    assert ran == ["hold"]
    assert await kinds(app, "g") == [EventKind.EXECUTION_STARTED]
    assert await check_replay(app) == ["g"]
    app.reported.clear()  # type: ignore[attr-defined]


async def test_a_taskgroup_that_cancels_the_body_in_a_step_stops_the_run_with_its_error(
    app: Loom,
) -> None:
    """A task of the body's TaskGroup that fails cancels the body in the middle of a step:
    the body ends with the group's error, and the run stops rather than record that end
    (a replay would run the step again), the group's error as the stop's cause (it was
    recorded as the execution's failure)."""

    async def hold() -> None:
        await asyncio.Event().wait()

    async def heartbeat() -> None:
        raise ConnectionError("heartbeat lost")

    @app.workflow()
    async def beats(ctx: Context) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(heartbeat())
            await ctx.step(hold)

    handle = await app.start(beats, id="t")
    with pytest.raises(DurableCallCancelledError) as stopped:
        await handle.result(timeout=5)
    cause = stopped.value.__cause__
    assert isinstance(cause, ExceptionGroup)
    assert [type(e) for e in cause.exceptions] == [ConnectionError]
    assert await kinds(app, "t") == [EventKind.EXECUTION_STARTED]
    assert await check_replay(app) == ["t"]
    app.reported.clear()  # type: ignore[attr-defined]



# -- what is registered as a body -------------------------------------------------------------


def traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator of the kind tracing and retry libraries write: a sync wrapper."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        return fn(*args)

    return wrapper


def test_a_body_registered_in_a_form_it_cannot_run_in_is_refused_naming_the_mistake(
    app: Loom,
) -> None:
    """An async generator, or an async def behind a decorator's sync wrapper, is an
    ``async def`` as the user wrote it: the refusal says which it is and what to do (it
    asked for an 'async def' of them alike)."""

    async def yields(ctx: Context) -> AsyncIterator[int]:
        yield 1

    @traced
    async def wrapped(ctx: Context) -> str:
        return "ran"

    with pytest.raises(InvalidOptionError, match="not an async generator") as generator:
        app.workflow()(yields)  # type: ignore[type-var]  # the mistake under test
    assert "return the items in a list" in str(generator.value)
    with pytest.raises(InvalidOptionError, match="a sync wrapper of the async def") as wrapper:
        app.workflow()(wrapped)
    assert "make the wrapper 'async def'" in str(wrapper.value)
    assert dict(app.workflows) == {}



# -- a ctx kept from an earlier run ------------------------------------------------------------


async def test_a_ctx_kept_from_an_earlier_run_of_the_execution_is_refused_as_such(
    app: Loom, clock: VirtualClock
) -> None:
    """The body runs again from the top after a park, with a ctx of its own: a ctx (or a
    durable call) kept from the run before is refused with ``where="earlier"``, whose
    message says to use the ctx this run is given (it said the call was made in "the body
    of another execution"), and nothing is recorded for it."""
    kept: dict[str, Context] = {}
    made: dict[str, Durable[object]] = {}
    said: list[str] = []

    @app.workflow()
    async def keeps(ctx: Context) -> list[str]:
        first = kept.setdefault(ctx.execution_id, ctx)
        call = ctx.step(echo, "made in every run, never awaited by it")
        if made.setdefault("call", call) is not call:
            call.close()
        await ctx.sleep(5)
        refused: list[str] = []
        attempts: list[Callable[[], Awaitable[object]]] = [
            lambda: first.step(echo, "through the kept ctx"),
            lambda: made["call"],
        ]
        for attempt in attempts:
            try:
                await attempt()
            except ContextOutsideBodyError as exc:
                refused.append(exc.where)
                said.append(str(exc))
        return [*refused, str(await ctx.step(echo, "own ctx"))]

    handle = await app.start(keeps, id="k")
    await app.drain()
    await clock.advance(5)
    assert await handle.result(timeout=5) == ["earlier", "earlier", "own ctx"]
    assert "through the ctx the body is given in this run" in said[0]
    steps = [
        e.payload["result"]  # type: ignore[call-overload,index]
        for e in await app.storage.events.read("k")
        if e.kind == EventKind.STEP_COMPLETED and e.payload["call"] == "step"  # type: ignore[call-overload,index]
    ]
    assert steps == ["own ctx"]  # the refused calls recorded nothing
    made["call"].close()
