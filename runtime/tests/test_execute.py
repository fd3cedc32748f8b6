"""``app.execute``: a workflow driven in the caller's task, and what happens when that task
is cancelled while the body runs."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from loom_runtime import AppNotRunningError, Context, Loom, WorkflowFailedError
from loom_runtime.testing import VirtualClock

from loom_core import EventKind, ExecutionAlreadyExistsError, InvalidInputError, open_storage


async def kinds(app: Loom, execution_id: str) -> list[str]:
    return [e.kind for e in await app.storage.events.read(execution_id)]


async def test_the_body_runs_in_the_callers_task_and_its_result_is_returned(app: Loom) -> None:
    caller = asyncio.current_task()
    seen: list[object] = []

    async def reserve(order: str) -> dict[str, str]:
        return {"reserved": order}

    @app.workflow(name="checkout")
    async def checkout(ctx: Context, order: str) -> dict[str, object]:
        seen.append(asyncio.current_task())
        seen.append(app.driving)
        return {"card": await ctx.step(reserve, order)}

    assert await app.execute(checkout, "o-1", id="order-1") == {"card": {"reserved": "o-1"}}
    assert seen == [caller, frozenset({"order-1"})]
    assert app.driving == frozenset()
    assert await kinds(app, "order-1") == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_COMPLETED,
    ]
    # By name too, as start takes it.
    assert await app.execute("checkout", "o-2", id="order-2") == {"card": {"reserved": "o-2"}}


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="unset")


async def test_the_body_sees_and_sets_the_callers_context_variables(app: Loom) -> None:
    @app.workflow()
    async def tagged(ctx: Context) -> str:
        seen = _REQUEST.get()
        _REQUEST.set("set by the body")
        return seen

    _REQUEST.set("the caller's")
    assert await app.execute(tagged, id="t") == "the caller's"
    assert _REQUEST.get() == "set by the body"


async def test_a_body_that_parks_is_resumed_and_its_result_waited_for(
    app: Loom, clock: VirtualClock
) -> None:
    began = asyncio.Event()

    async def begin() -> None:
        began.set()

    @app.workflow()
    async def nap(ctx: Context) -> str:
        await ctx.step(begin)
        await ctx.sleep(30)
        return "awake"

    call = asyncio.create_task(app.execute(nap, id="n"))
    await began.wait()
    await app.drain()  # until the body, in the caller's task, has parked
    assert await app.get("n").status() == "suspended"
    assert not call.done()
    await clock.advance(30)
    assert await asyncio.wait_for(call, 5) == "awake"


async def test_a_failed_workflow_raises_as_its_handle_would(app: Loom) -> None:
    @app.workflow()
    async def broken(ctx: Context) -> None:
        raise ValueError("no stock")

    with pytest.raises(WorkflowFailedError, match="no stock"):
        await app.execute(broken, id="b")
    assert (await kinds(app, "b"))[-1] == EventKind.EXECUTION_FAILED


async def test_refusals_come_before_the_body_runs_and_write_nothing(app: Loom) -> None:
    ran: list[int] = []

    @app.workflow()
    async def once(ctx: Context, n: int) -> int:
        ran.append(n)
        return n

    assert await app.execute(once, 1, id="same") == 1
    before = await app.storage.events.read("same")
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.execute(once, 2, id="same")
    with pytest.raises(InvalidInputError):
        await app.execute(once, object(), id="other")  # type: ignore[arg-type]
    assert await app.storage.events.read("same") == before
    assert await app.storage.events.read("other") == ()
    assert ran == [1]
    outside = Loom("memory://")
    outside.workflow(name="once")(once)
    with pytest.raises(AppNotRunningError):
        await outside.execute(once, 3)


async def test_a_cancelled_caller_leaves_the_execution_to_the_app_which_finishes_it(
    app: Loom,
) -> None:
    ran: list[str] = []
    entered, gate = asyncio.Event(), asyncio.Event()

    async def charge() -> str:
        ran.append("charge")
        return "charged"

    async def ship() -> str:
        ran.append("ship")
        entered.set()
        await gate.wait()
        return "shipped"

    @app.workflow()
    async def order(ctx: Context) -> list[str]:
        return [await ctx.step(charge), await ctx.step(ship)]

    call = asyncio.create_task(app.execute(order, id="o"))
    await entered.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The app took it over, under a fresh fence, and drives it in a task of its own: the
    # recorded step is served from the log; the one the cancellation cut runs again.
    gate.set()
    assert await app.get("o").result(timeout=5) == ["charged", "shipped"]
    assert ran == ["charge", "ship", "ship"]
    assert await kinds(app, "o") == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_RECOVERED,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_COMPLETED,
    ]
    log = await app.storage.events.read("o")
    started, recovered = log[0].payload, log[2].payload
    assert isinstance(started, dict)
    assert recovered == {  # the start wrote under 0; a live process took its own run back
        "node": app.node, "fence": 1, "fingerprint": started["fingerprint"], "carried_on": True
    }


async def test_drain_waits_for_an_execute_in_another_task_and_not_for_its_own(app: Loom) -> None:
    gate = asyncio.Event()
    drained_inside: list[bool] = []

    async def wait_for_gate() -> int:
        await gate.wait()
        return 1

    async def drain_here() -> int:
        await app.drain()  # from the execute's own task: must not wait for itself
        drained_inside.append(True)
        return 2

    @app.workflow()
    async def slow(ctx: Context) -> int:
        return await ctx.step(wait_for_gate)

    @app.workflow()
    async def draining(ctx: Context) -> int:
        return await ctx.step(drain_here)

    call = asyncio.create_task(app.execute(slow, id="slow"))
    await asyncio.sleep(0)
    drain = asyncio.create_task(app.drain())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not drain.done()
    gate.set()
    await asyncio.wait_for(drain, 5)
    assert call.done()
    assert call.result() == 1
    assert await asyncio.wait_for(app.execute(draining, id="d"), 5) == 2
    assert drained_inside == [True]



async def test_leaving_the_app_as_the_run_answers_its_own_park_runs_nothing_after() -> None:
    """The app is left between the run's answer to its own park (a message came while
    it parked) and the run that goes on from it: that run is the next start's, so no
    step runs after the app has left and nothing is reported; execute raises
    AppNotRunningError, and the execution stays running."""
    effects: list[str] = []
    reported: list[BaseException] = []
    parked, go_on = asyncio.Event(), asyncio.Event()
    answered, finish = asyncio.Event(), asyncio.Event()

    async def charge() -> str:
        effects.append("charged")
        return "ok"

    app = Loom("memory://", node="n", on_error=reported.append, timers=False)

    @app.workflow(name="pays")
    async def pays(ctx: Context) -> str:
        await ctx.receive("t")
        return str(await ctx.step(charge))

    async with app:
        events = app.storage.events
        append = events.append

        async def held(execution_id: str, new: Any, **options: Any) -> Any:
            written = await append(execution_id, new, **options)
            kinds = {event.kind for event in new}
            if EventKind.EXECUTION_SUSPENDED in kinds and not go_on.is_set():
                parked.set()
                await go_on.wait()
            if EventKind.MESSAGE_CONSUMED in kinds and not finish.is_set():
                answered.set()
                await finish.wait()
            return written

        events.append = held  # type: ignore[method-assign,assignment]
        caller = asyncio.create_task(app.execute(pays, id="x"))
        await parked.wait()  # the park is written; the run has not settled
        await app.send("x", "t", 1)
        go_on.set()  # the run settles and answers its own park...
        await answered.wait()  # ... and its answer is written: the app is left now
        log = await app.storage.events.read("x")
    finish.set()
    with pytest.raises(AppNotRunningError):
        await caller
    assert effects == []
    assert reported == []
    assert [event.kind for event in log][-2:] == [
        EventKind.MESSAGE_CONSUMED, EventKind.EXECUTION_RESUMED
    ]


async def test_an_execute_waiting_as_the_app_closes_its_storage_raises_app_not_running() -> None:
    """The app is left while execute() waits for its parked execution and is reading its
    log: the storage closes under the read, and execute raises AppNotRunningError, as
    documented, not the store's StoreClosedError ("open the storage again")."""
    app = Loom("memory://", node="n", timers=False)
    reading, closed = asyncio.Event(), asyncio.Event()

    @app.workflow(name="waits")
    async def waits(ctx: Context) -> object:
        return await ctx.receive("t")

    parked = asyncio.Event()
    async with app:
        events = app.storage.events
        read, append = events.read, events.append

        async def noted(execution_id: str, new: Any, **options: Any) -> Any:
            written = await append(execution_id, new, **options)
            if any(event.kind == EventKind.EXECUTION_SUSPENDED for event in new):
                parked.set()
            return written

        async def held(execution_id: str, **options: Any) -> Any:
            if execution_id == "x" and parked.is_set() and not closed.is_set():
                reading.set()  # the read of result()'s wait, the run having parked
                await closed.wait()
            return await read(execution_id, **options)

        events.read = held  # type: ignore[method-assign]
        events.append = noted  # type: ignore[method-assign,assignment]
        caller = asyncio.create_task(app.execute(waits, id="x"))
        await reading.wait()
    closed.set()
    with pytest.raises(AppNotRunningError, match=r"app\.execute was cut short"):
        await caller


async def test_an_execute_whose_start_lands_as_the_app_is_left_runs_no_body() -> None:
    """The app is left while execute() writes the start: the body does not run after
    (its step ran, and the run wrote to the log, after the app had left); the execution
    stays running for the node's next start."""
    effects: list[str] = []
    writing, written = asyncio.Event(), asyncio.Event()

    async def charge() -> str:
        effects.append("charged")
        return "ok"

    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", timers=False)

        @app.workflow(name="pays")
        async def pays(ctx: Context) -> str:
            return str(await ctx.step(charge))

        append = storage.events.append

        async def held(execution_id: str, new: Any, **options: Any) -> Any:
            if any(event.kind == EventKind.EXECUTION_STARTED for event in new):
                writing.set()
                await written.wait()
            return await append(execution_id, new, **options)

        storage.events.append = held  # type: ignore[method-assign,assignment]
        async with app:
            caller = asyncio.create_task(app.execute(pays, id="x"))
            await writing.wait()
        written.set()
        with pytest.raises(AppNotRunningError, match="was cut short"):
            await caller
        assert effects == []
        assert [e.kind for e in await storage.events.read("x")] == [
            EventKind.EXECUTION_STARTED
        ]


async def test_leaving_an_app_on_a_storage_of_ones_own_ends_the_waits_for_a_parked_result() -> None:
    """On a storage the caller opened, which stays open when the app is left, an
    execute() and a result() waiting for a parked execution raise AppNotRunningError
    once the app is left (they read the open store for ever, with nothing of this
    process left to drive the execution), and the execution stays parked."""
    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", timers=False)

        @app.workflow(name="waits")
        async def waits(ctx: Context) -> object:
            return await ctx.receive("t")

        async with app:
            caller = asyncio.create_task(app.execute(waits, id="x"))
            await app.drain()
            waiter = asyncio.create_task(app.get("x").result())
            await asyncio.sleep(0)  # both wait now
        for task, call in ((caller, r"app\.execute"), (waiter, r"handle\.result\(\)")):
            with pytest.raises(AppNotRunningError, match=rf"{call} was cut short"):
                await asyncio.wait_for(task, 10)  # a bound, never reached: it ends at once
        assert (await app.get("x").view()).status == "suspended"
        with pytest.raises(AppNotRunningError, match="needs a running app"):
            await app.get("x").result()
