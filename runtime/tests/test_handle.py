"""A handle: ``result()`` wakes on a write that lands between its read and its wait, and
``send``, ``get_event`` and ``cancel`` act on its own execution."""

from __future__ import annotations

import asyncio
import gc
from datetime import timedelta

import pytest
from loom_runtime import (
    Context,
    ExecutionCancelledError,
    Handle,
    Loom,
    ResultTimeoutError,
    WorkflowFailedError,
)
from loom_runtime.fold import View

from loom_core import Event, EventKind, InvalidInputError, open_storage


async def test_a_completion_between_the_handles_read_and_its_wait_wakes_it(app: Loom) -> None:
    gate = asyncio.Event()

    async def slow() -> int:
        await gate.wait()
        return 7

    @app.workflow()
    async def flow(ctx: Context) -> int:
        return await ctx.step(slow)

    handle = await app.start(flow, id="between")
    read = app.inspect
    waits: list[bool] = []

    async def read_then_complete(execution_id: str) -> View:
        view = await read(execution_id)
        if view.status == "running":
            gate.set()
            await app.drain()  # the run writes its completion now, after the read
        return view

    wait = app.wait_changed

    async def record_wait(
        execution_id: str, seconds: float, signal: asyncio.Event | None = None
    ) -> None:
        waits.append(signal is not None and signal.is_set())
        await wait(execution_id, seconds, signal)

    async def not_waiting_for_the_run(execution_id: str, seconds: float | None) -> None:
        return None  # take the path of a run driven elsewhere: read the log, then wait

    app._local_end = not_waiting_for_the_run  # type: ignore[method-assign]
    app.inspect = read_then_complete  # type: ignore[method-assign]
    app.wait_changed = record_wait  # type: ignore[method-assign]
    assert await handle.result(timeout=5) == 7
    assert waits == [True]  # the wait began already woken: the completion was not missed


async def test_a_handle_sends_reads_events_and_cancels_its_own_execution(app: Loom) -> None:
    @app.workflow()
    async def approval(ctx: Context) -> object:
        await ctx.set_event("stage", "waiting")
        first = await ctx.receive("note")
        await ctx.set_event("stage", first)
        return await ctx.receive("never")

    handle = await app.start(approval, id="h")
    other = await app.start(approval, id="other")
    assert await handle.get_event("stage", timeout=5) == "waiting"
    message_id = await handle.send("note", "read", key="n-1")
    assert await handle.send("note", "again", key="n-1") == message_id
    await app.drain()  # the delivery drives the body on in a task of the app's
    assert await handle.get_event("stage", timeout=5) == "read"
    assert await handle.cancel(reason="done") is True
    with pytest.raises(ExecutionCancelledError):
        await handle.result(timeout=5)
    assert await handle.cancel() is False  # finished already
    assert await other.status() == "suspended"  # only its own execution
    assert await other.get_event("stage") == "waiting"


async def test_reading_finished_executions_leaves_no_watch_behind(app: Loom) -> None:
    @app.workflow()
    async def quick(ctx: Context, k: int) -> int:
        await ctx.set_event("k", k)
        return k

    for k in range(50):
        await app.execute(quick, k, id=f"q{k}")
    for k in range(50):
        assert await app.get(f"q{k}").result(timeout=5) == k
        assert await app.get_event(f"q{k}", "k") == k
    gc.collect()
    assert len(app._signals) == 0  # nothing waits: nothing is kept


async def test_a_reader_that_gives_up_leaves_the_others_watching(app: Loom) -> None:
    @app.workflow()
    async def parked(ctx: Context) -> object:
        return await ctx.receive("go")

    handle = await app.start(parked, id="p")
    await app.drain()
    patient = asyncio.ensure_future(handle.result())
    events = asyncio.ensure_future(app.get_event("p", "never-set"))
    await asyncio.sleep(0)
    with pytest.raises(ResultTimeoutError):
        await handle.result(timeout=0.01)
    assert await app.get_event("p", "never-set", timeout=0.01) is None
    assert len(app._signals["p"]) == 2  # the two still waiting, and only they
    await app.send("p", "go", 1)
    assert await asyncio.wait_for(patient, 5) == 1
    assert await asyncio.wait_for(events, 5) is None  # it ended without the key
    gc.collect()
    assert app._signals == {}


async def test_a_chains_failure_or_cancellation_names_the_id_the_caller_knows(app: Loom) -> None:
    @app.workflow(name="again")
    async def again(ctx: Context, generation: int) -> None:
        if generation == 0:
            ctx.continue_as_new(1)
        raise ValueError("gave up")

    @app.workflow(name="wait_again")
    async def wait_again(ctx: Context, generation: int) -> None:
        if generation == 0:
            ctx.continue_as_new(1)
        await ctx.sleep(60)

    failing = await app.start(again, 0, id="job")
    with pytest.raises(WorkflowFailedError) as failed:
        await failing.result(timeout=5)
    assert failed.value.execution_id == "job"
    waiting = await app.start(wait_again, 0, id="nap")
    await app.drain()
    assert await app.cancel("nap", reason="enough")
    with pytest.raises(ExecutionCancelledError) as cancelled:
        await waiting.result(timeout=5)
    assert cancelled.value.execution_id == "nap"


async def test_waits_take_a_timedelta_as_every_other_timeout_does(app: Loom) -> None:
    @app.workflow(name="naps")
    async def naps(ctx: Context) -> None:
        await ctx.sleep(timedelta(hours=1))

    handle = await app.start(naps, id="t")
    await app.drain()
    with pytest.raises(ResultTimeoutError):
        await handle.result(timeout=timedelta(milliseconds=1))
    assert await handle.get_event("progress", timeout=timedelta(0)) is None
    with pytest.raises(InvalidInputError, match="or a timedelta"):
        await handle.result(timeout=timedelta(seconds=-1))


async def test_result_passes_on_a_cancellation_that_comes_with_the_end() -> None:
    """The caller of ``result()`` cancelled in the loop turn its execution ends gets the
    cancellation, not the result (Python 3.11's ``asyncio.wait_for`` would drop it)."""
    caller: list[asyncio.Task[object]] = []

    def on_durable(event: Event) -> None:
        if event.kind == EventKind.EXECUTION_COMPLETED:
            asyncio.get_running_loop().call_soon(caller[0].cancel)

    app = Loom("memory://", node="n1", on_durable_event=on_durable)
    gate = asyncio.Event()
    after: list[object] = []

    async def work() -> str:
        await gate.wait()
        return "done"

    @app.workflow()
    async def flow(ctx: Context) -> str:
        return await ctx.step(work)

    async def wait_for_it(handle: Handle[str]) -> object:
        after.append(await handle.result(timeout=60))  # must not run: it was cancelled
        return after[-1]

    async with app:
        handle = await app.start(flow, id="f")
        caller.append(asyncio.create_task(wait_for_it(handle)))
        await asyncio.sleep(0)  # it waits for the run's end
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await caller[0]
    assert after == []


@pytest.mark.parametrize("where", ["here", "another process"])
async def test_result_of_a_cancelled_execution_does_not_wait_for_its_step_in_flight(
    where: str,
) -> None:
    """A cancel fences the run out, and it stops at its next durable call; a step in
    flight finishes first. ``result()`` raises the cancellation without waiting for that
    step (one that never returns would hold it for ever): at once for a cancel of its own
    process, and within a second of one made elsewhere (it reads the log meanwhile)."""
    storage = await open_storage("memory://")
    app = Loom(storage, node="n1")
    other = Loom(storage, node="n2", timers=False, recover=False)
    in_step, finish = asyncio.Event(), asyncio.Event()

    async def hangs() -> str:
        in_step.set()
        await finish.wait()
        return "late"

    @app.workflow()
    async def flow(ctx: Context) -> str:
        return await ctx.step(hangs)

    try:
        async with app, other:
            handle = await app.start(flow, id="f")
            await in_step.wait()
            assert await (app if where == "here" else other).cancel("f", reason="stop")
            waiting = asyncio.create_task(handle.result())  # no timeout= to run out
            # A bound only on a failure: a correct run is done in a second at most.
            await asyncio.wait({waiting}, timeout=20)
            assert waiting.done(), "result() waited for the step in flight"
            with pytest.raises(ExecutionCancelledError):
                waiting.result()
            finish.set()
            await app.drain()
    finally:
        await storage.close()


async def test_a_cancel_of_a_deleted_log_is_not_the_result_of_one_made_anew() -> None:
    """result() hears of a cancel its process wrote while the cancelled run winds down;
    a log deleted and started anew under the same id meanwhile is another execution, and
    its result() waits for its own end."""
    storage = await open_storage("memory://")
    app = Loom(storage, node="n1")
    in_step, finish, go_on = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hangs(tag: str) -> str:
        if tag == "old":
            in_step.set()
            await finish.wait()
        else:
            await go_on.wait()
        return tag

    @app.workflow()
    async def flow(ctx: Context, tag: str) -> str:
        return await ctx.step(hangs, tag)

    try:
        async with app:
            await app.start(flow, "old", id="f")
            await in_step.wait()
            assert await app.cancel("f", reason="the old one")
            assert await storage.events.delete_execution("f")
            handle = await app.start(flow, "new", id="f")
            waiting = asyncio.create_task(handle.result())
            for _ in range(5):  # the old cancel would be raised in the first of them
                await asyncio.sleep(0)
            assert not waiting.done()
            go_on.set()
            assert await waiting == "new"
            finish.set()
            await app.drain()
    finally:
        await storage.close()
