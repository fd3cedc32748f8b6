"""Where durable calls may be made, and what the log records however a body ends: a call
inside a step or from a task the body started is refused, an error's words are recorded
even when no store could hold them as they are, a BaseException stops the run loudly,
default step names do not depend on the module, and a patch can be retired."""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
from collections.abc import Callable
from typing import Any

import pytest
from loom_runtime import (
    Context,
    ContextOutsideBodyError,
    Durable,
    ExecutionCancelledError,
    Loom,
    RunStoppedError,
    StepFailedError,
    WorkflowFailedError,
)
from loom_runtime.testing import VirtualClock, check_replay

from loom_core import EventKind, Storage, open_storage


def reported(app: Loom) -> list[BaseException]:
    errors: list[BaseException] = app.reported  # type: ignore[attr-defined]
    return errors


async def kinds(app: Loom, execution_id: str) -> list[str]:
    return [e.kind for e in await app.storage.events.read(execution_id)]


# -- a durable call inside a step ----------------------------------------------------------


async def test_a_durable_call_inside_a_step_is_refused_and_recorded_as_its_failure(
    app: Loom,
) -> None:
    ran: list[str] = []

    async def async_step(ctx: Context) -> str:
        ran.append("async")
        return ctx.now().isoformat()

    def thread_step(ctx: Context) -> str:  # a sync step runs in a worker thread
        ran.append("thread")
        return str(ctx.uuid())

    async def task_step(ctx: Context) -> str:
        ran.append("task")

        async def inner() -> str:
            return str(await ctx.step(async_step, ctx))

        return await asyncio.create_task(inner())  # a task a step makes is the step's

    @app.workflow()
    async def nests(ctx: Context) -> list[object]:
        refused: list[object] = []
        for fn in (async_step, thread_step, task_step):
            try:
                await ctx.step(fn, ctx)
            except StepFailedError as exc:
                refused.append([exc.error_type, "inside a step" in exc.error_message])
        return refused

    handle = await app.start(nests, id="n")
    where = ["loom_runtime.errors.ContextOutsideBodyError", True]
    assert await handle.result(timeout=5) == [where, where, where]
    assert ran == ["async", "thread", "task"]
    assert await kinds(app, "n") == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_FAILED,
        EventKind.STEP_FAILED,
        EventKind.STEP_FAILED,
        EventKind.EXECUTION_COMPLETED,
    ]
    # Recorded as the steps' failures at the steps' own positions: a replay serves them.
    assert await check_replay(app) == ["n"]
    assert ran == ["async", "thread", "task"]


async def test_continue_as_new_inside_a_step_or_after_the_end_is_refused(app: Loom) -> None:
    """``ctx.continue_as_new`` is a durable call like the others: in a step's function
    it fails the step with ContextOutsideBodyError (the execution does not continue), and
    on a ``ctx`` kept after the body ended it raises that error too."""
    kept: list[Context] = []

    def restart(ctx: Context) -> str:
        ctx.continue_as_new()
        return "unreached"

    @app.workflow()
    async def once(ctx: Context) -> list[object]:
        kept.append(ctx)
        try:
            await ctx.step(restart, ctx)
        except StepFailedError as exc:
            return [exc.error_type, "inside a step" in exc.error_message]
        return ["continued in a step"]

    handle = await app.start(once, id="s")
    assert await handle.result(timeout=5) == [
        "loom_runtime.errors.ContextOutsideBodyError", True
    ]
    assert await kinds(app, "s") == [
        EventKind.EXECUTION_STARTED, EventKind.STEP_FAILED, EventKind.EXECUTION_COMPLETED
    ]
    with pytest.raises(ContextOutsideBodyError):
        kept[0].continue_as_new()


# -- a durable call from a task or thread the body started ----------------------------------


async def test_a_durable_call_from_a_task_the_body_started_is_refused(app: Loom) -> None:
    async def charge() -> str:
        return "charged"

    async def helper(ctx: Context) -> object:
        return await ctx.step(charge)

    @app.workflow()
    async def spawns(ctx: Context) -> list[str]:
        refused: list[str] = []
        for make in (
            lambda: asyncio.create_task(helper(ctx)),
            lambda: asyncio.ensure_future(helper(ctx)),
            lambda: asyncio.to_thread(ctx.now),  # a thread gets a copy of the context too
        ):
            try:
                await make()
            except ContextOutsideBodyError as exc:
                refused.append(exc.where)

        async def branch() -> object:  # a gather branch is the body's; its own task is not
            try:
                return await asyncio.create_task(helper(ctx))
            except ContextOutsideBodyError as exc:
                return exc.where

        (from_branch,) = await ctx.gather(branch())
        assert isinstance(from_branch, str)
        return [*refused, from_branch, str(await ctx.step(charge))]

    handle = await app.start(spawns, id="s")
    assert await handle.result(timeout=5) == ["task", "task", "task", "task", "charged"]
    assert await check_replay(app) == ["s"]


async def test_a_durable_call_awaited_by_a_task_the_body_started_is_refused(
    app: Loom, clock: VirtualClock
) -> None:
    """Two receives raced with asyncio.wait: each is awaited by a task of asyncio's, so
    the run would park as soon as one of them waits, listing only that one, and a message
    on the other topic would never wake it. Refused; ctx.gather is the way."""

    @app.workflow()
    async def races(ctx: Context) -> list[str]:
        approve = asyncio.ensure_future(ctx.receive("approve", timeout=3600))
        reject = asyncio.ensure_future(ctx.receive("reject", timeout=3600))
        done, _ = await asyncio.wait([approve, reject], return_when=asyncio.ALL_COMPLETED)
        refused = [
            exc.where
            for task in (approve, reject)
            if isinstance(exc := task.exception(), ContextOutsideBodyError)
        ]
        assert len(done) == 2
        step = ctx.step(echo, "awaited by the body")  # made and awaited by the body: fine
        return [*refused, await step]

    handle = await app.start(races, id="race")
    assert await handle.result(timeout=5) == ["task", "task", "awaited by the body"]
    assert await check_replay(app) == ["race"]


async def echo(value: str) -> str:
    return value


async def test_a_task_the_body_left_behind_writes_nothing_after_the_end(app: Loom) -> None:
    go = asyncio.Event()
    ran: list[str] = []
    late: list[BaseException] = []

    async def charge() -> str:
        ran.append("charge")
        return "charged"

    async def lingers(ctx: Context) -> None:
        await go.wait()
        try:
            await ctx.step(charge)
        except ContextOutsideBodyError as exc:
            late.append(exc)

    left: list[asyncio.Task[None]] = []

    @app.workflow()
    async def returns_early(ctx: Context) -> str:
        left.append(asyncio.create_task(lingers(ctx)))
        return "done"

    assert await (await app.start(returns_early, id="r")).result(timeout=5) == "done"
    go.set()
    await left[0]
    assert [type(e) for e in late] == [ContextOutsideBodyError]
    assert ran == []
    assert (await kinds(app, "r"))[-1] == EventKind.EXECUTION_COMPLETED
    assert await check_replay(app) == ["r"]


# -- a ctx kept from another execution ---------------------------------------------------------


async def test_a_ctx_used_in_another_executions_body_is_refused_and_records_nothing(
    app: Loom,
) -> None:
    """A ``ctx`` is its own execution's: used in another body, while its execution is
    running or after it finished, every durable call through it is refused with
    ``where="other"``, and neither log records it."""
    kept: dict[str, Context] = {}
    holding, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    async def hold() -> str:
        holding.set()
        await release.wait()
        return "held"

    async def effect() -> str:
        ran.append("effect")
        return "done"

    @app.workflow()
    async def keeps(ctx: Context, hold_it: bool) -> str:
        kept[ctx.execution_id] = ctx
        return str(await ctx.step(hold)) if hold_it else "kept"

    @app.workflow()
    async def borrows(ctx: Context, owner: str) -> list[str]:
        other = kept[owner]
        refused: list[str] = []
        calls: list[Callable[[], object]] = [
            lambda: other.step(effect),
            lambda: other.sleep(1),
            lambda: other.now(),
            lambda: other.patched("p"),
            lambda: other.receive("topic"),
            lambda: other.continue_as_new(False),
        ]
        for call in calls:
            try:
                made = call()
                if inspect.isawaitable(made):
                    await made
            except ContextOutsideBodyError as exc:
                refused.append(exc.where)

        async def branch() -> object:
            return await other.step(effect)

        try:
            await ctx.gather(branch())
        except ContextOutsideBodyError as exc:
            refused.append(exc.where)
        return refused

    running = await app.start(keeps, True, id="running")
    await holding.wait()
    before = await app.storage.events.read("running")
    finished = await app.start(keeps, False, id="finished")
    assert await finished.result(timeout=5) == "kept"
    ended = await app.storage.events.read("finished")

    for owner in ("running", "finished"):
        borrower = await app.start(borrows, owner, id=f"borrows-{owner}")
        assert await borrower.result(timeout=5) == ["other"] * 7
    assert ran == []
    assert await app.storage.events.read("running") == before
    assert await app.storage.events.read("finished") == ended
    assert await kinds(app, "borrows-running") == [
        EventKind.EXECUTION_STARTED, EventKind.EXECUTION_COMPLETED
    ]
    release.set()
    assert await running.result(timeout=5) == "held"
    assert await check_replay(app) == sorted(
        ["borrows-finished", "borrows-running", "finished", "running"]
    )
    assert reported(app) == []


async def test_a_durable_call_made_by_one_execution_and_awaited_in_another_is_refused(
    app: Loom,
) -> None:
    made: dict[str, Durable[str]] = {}
    holding, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    async def effect() -> str:
        ran.append("effect")
        return "done"

    async def hold() -> str:
        holding.set()
        await release.wait()
        return "held"

    @app.workflow()
    async def makes(ctx: Context) -> str:
        made["call"] = ctx.step(effect)  # made here, never awaited here
        return str(await ctx.step(hold))

    @app.workflow()
    async def awaits(ctx: Context) -> str:
        try:
            await made["call"]
        except ContextOutsideBodyError as exc:
            return exc.where
        return "awaited"

    maker = await app.start(makes, id="maker")
    await holding.wait()
    assert await (await app.start(awaits, id="awaiter")).result(timeout=5) == "other"
    release.set()
    assert await maker.result(timeout=5) == "held"
    assert ran == []
    assert EventKind.STEP_COMPLETED in await kinds(app, "maker")
    assert len(await app.storage.events.read("maker")) == 3  # started, hold, completed


# -- an error's words ------------------------------------------------------------------------


async def test_an_error_message_no_store_can_hold_as_it_is_is_recorded_escaped(
    app: Loom,
) -> None:
    async def nul() -> None:
        raise ValueError("bad\x00byte")

    said: list[str] = []

    @app.workflow()
    async def fails(ctx: Context) -> None:
        try:
            await ctx.step(nul)
        except StepFailedError as exc:
            said.append(exc.error_message)
        raise ValueError("lone \udc80 surrogate")

    handle = await app.start(fails, id="f")
    with pytest.raises(WorkflowFailedError) as failed:
        await handle.result(timeout=5)
    assert said == ["bad\\x00byte"]
    assert failed.value.error_type == "ValueError"
    assert failed.value.error_message == "lone \\udc80 surrogate"
    assert await kinds(app, "f") == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_FAILED,
        EventKind.EXECUTION_FAILED,
    ]
    assert reported(app) == []
    assert await check_replay(app) == ["f"]


async def test_a_step_failure_has_no_cause_live_as_on_replay(app: Loom) -> None:
    class Declined(Exception):
        pass

    async def pay() -> None:
        raise Declined("declined 51")

    @app.workflow()
    async def pays(ctx: Context) -> list[object]:
        try:
            await ctx.step(pay)
        except StepFailedError as exc:
            return [exc.__cause__ is None, exc.__context__ is None, exc.error_message]
        return []

    assert await (await app.start(pays, id="p")).result(timeout=5) == [True, True, "declined 51"]
    assert await check_replay(app) == ["p"]


# -- a BaseException that is not an Exception -------------------------------------------------


class Abort(BaseException):
    pass


async def test_a_base_exception_stops_the_run_loudly_and_a_recovery_carries_it_on(
    app: Loom,
) -> None:
    ran: list[str] = []
    abort = [True]

    async def charge() -> str:
        ran.append("charge")
        if abort[0]:
            raise Abort
        return "charged"

    @app.workflow()
    async def aborts(ctx: Context) -> object:
        return await ctx.step(charge)

    handle = await app.start(aborts, id="a")
    with pytest.raises(RunStoppedError, match="raised Abort") as stopped:
        await handle.result(timeout=5)
    assert isinstance(stopped.value.__cause__, Abort)
    assert reported(app) == [stopped.value]
    assert await kinds(app, "a") == [EventKind.EXECUTION_STARTED]  # nothing recorded
    assert await handle.status() == "running"

    abort[0] = False
    await app.recover()
    assert await handle.result(timeout=5) == "charged"
    assert ran == ["charge", "charge"]  # at least once: the first attempt was not recorded


@pytest.mark.parametrize("bound", [None, 3600])
async def test_a_generator_exit_from_a_sync_step_stops_the_run_loudly(
    app: Loom, bound: int | None
) -> None:
    """A sync step's GeneratorExit stops the run as any BaseException does, bounded or
    not (handed out of its thread through a future, it closed the run's coroutines
    instead: result() waited on, and on_error never heard)."""
    exiting = [True]

    def charge() -> str:
        if exiting[0]:
            raise GeneratorExit("the card reader's generator was closed")
        return "charged"

    @app.workflow()
    async def exits(ctx: Context) -> object:
        return await ctx.step(charge, timeout=bound)

    handle = await app.start(exits, id="g")
    with pytest.raises(RunStoppedError, match="raised GeneratorExit") as stopped:
        await handle.result(timeout=5)
    assert isinstance(stopped.value.__cause__, GeneratorExit)
    assert reported(app) == [stopped.value]
    assert await kinds(app, "g") == [EventKind.EXECUTION_STARTED]
    reported(app).clear()

    exiting[0] = False
    await app.recover()
    assert await handle.result(timeout=5) == "charged"


async def test_what_stopped_a_run_is_kept_until_the_execution_ends_and_for_so_many(
    app: Loom, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A halt is kept for result() while the execution stays running: a cancel here, or
    an end seen by result(), drops it (result() then raises the cancel), and the app
    keeps so many, the oldest dropped first (each holds the body's frames)."""
    from loom_runtime import app as app_module

    monkeypatch.setattr(app_module, "_HALTED_KEPT", 3)

    async def charge() -> None:
        raise Abort

    @app.workflow()
    async def aborts(ctx: Context) -> None:
        await ctx.step(charge)

    for k in range(5):
        await app.start(aborts, id=f"h{k}")
        await app.drain()
    assert list(app.halted) == ["h2", "h3", "h4"]
    assert await app.cancel("h3") is True
    assert list(app.halted) == ["h2", "h4"]
    with pytest.raises(ExecutionCancelledError):
        await app.get("h3").result(timeout=5)
    with pytest.raises(RunStoppedError):
        await app.get("h4").result(timeout=5)
    # Ended by another app on the same store: result() sees the end and drops the halt.
    other = Loom(app.storage, node="other", timers=False, recover=False)
    other.workflow(name=aborts.__qualname__)(aborts)
    async with other:
        assert await other.cancel("h4") is True
    with pytest.raises(ExecutionCancelledError):
        await app.get("h4").result(timeout=5)
    assert list(app.halted) == ["h2"]
    reported(app).clear()


# -- default step names --------------------------------------------------------------------------


async def quote(item: str, currency: str = "EUR") -> str:
    return f"{item} in {currency}"


class Pricer:
    async def __call__(self, item: str) -> str:
        return f"priced {item}"

    async def price(self, item: str) -> str:
        return f"priced {item}"


async def test_a_steps_default_name_is_its_qualified_name_without_the_module(
    app: Loom,
) -> None:
    pricer = Pricer()

    @app.workflow()
    async def names(ctx: Context) -> list[object]:
        return [
            await ctx.step(quote, "a"),
            await ctx.step(functools.partial(quote, currency="USD"), "b"),
            await ctx.step(functools.partial(functools.partial(quote), "c")),
            await ctx.step(pricer, "d"),
            await ctx.step(pricer.price, "e"),
        ]

    await (await app.start(names, id="names")).result(timeout=5)
    recorded = [
        e.payload["name"]  # type: ignore[call-overload,index]
        for e in await app.storage.events.read("names")
        if e.kind == EventKind.STEP_COMPLETED
    ]
    # Not "test_body_boundaries.quote": moving a function to another module, or running
    # its module as a script, keeps the names its executions recorded; a partial is its
    # function (two partials of one function differ in arguments, which replay does not
    # match, as it does not for any step).
    assert recorded == ["quote", "quote", "quote", "Pricer", "Pricer.price"]


# -- retiring a patch ------------------------------------------------------------------------


async def send_receipt(order: str) -> str:
    return f"receipt {order}"


async def ship(order: str) -> str:
    return f"shipped {order}"


def node(storage: Storage) -> Loom:
    return Loom(
        storage, node="n", clock=VirtualClock(), random=random.Random(3), recover=False,
    )


async def patched_then_retired(stage: str, storage: Storage, order: str) -> Loom:
    app = node(storage)

    async def fulfil(ctx: Context, order: str) -> str:
        if stage == "patched":
            if ctx.patched("receipt"):
                await ctx.step(send_receipt, order)
        elif stage == "deprecated":
            ctx.deprecate_patch("receipt")
            await ctx.step(send_receipt, order)
        else:  # the call removed
            await ctx.step(send_receipt, order)
        await ctx.sleep(60)
        return await ctx.step(ship, order)

    app.workflow(name="fulfil")(fulfil)
    await app.__aenter__()
    await app.start("fulfil", order, id=order)
    await app.drain()
    return app


async def finish(app: Loom, order: str) -> Any:
    clock = app.clock
    assert isinstance(clock, VirtualClock)
    await clock.advance(60)
    return await app.get(order).result(timeout=5)


async def test_a_patch_is_retired_with_deprecate_patch_then_removed() -> None:
    async with open_storage("memory://") as storage:
        # Stage 1: the patch checked; "o-1" records the marker and parks after it.
        first = await patched_then_retired("patched", storage, "o-1")
        await first.__aexit__(None, None, None)
        # Stage 2: once no execution runs the old path, deprecate_patch: "o-1" replays
        # past its marker and finishes; "o-2" records no marker.
        second = await patched_then_retired("deprecated", storage, "o-2")
        await second.resume("o-1", fence_if_parked_at=(await second.inspect("o-1")).park.sequence)  # type: ignore[union-attr]
        assert await second.get("o-1").result(timeout=5) == "shipped o-1"
        assert await finish(second, "o-2") == "shipped o-2"
        markers = {
            order: [
                e.payload["name"]  # type: ignore[call-overload,index]
                for e in await storage.events.read(order)
                if e.kind == EventKind.STEP_COMPLETED
                and e.payload["call"] == "patch"  # type: ignore[call-overload,index]
            ]
            for order in ("o-1", "o-2")
        }
        assert markers == {"o-1": ["receipt"], "o-2": []}
        assert sorted(await check_replay(second)) == ["o-1", "o-2"]
        await second.__aexit__(None, None, None)
        # Stage 3: once no execution with the marker is left (o-1 is finished and
        # pruned, say), the call goes: an execution without the marker replays as before.
        await storage.events.delete_execution("o-1")
        third = await patched_then_retired("removed", storage, "o-3")
        try:
            assert await finish(third, "o-3") == "shipped o-3"
            assert sorted(await check_replay(third)) == ["o-2", "o-3"]
        finally:
            await third.__aexit__(None, None, None)
