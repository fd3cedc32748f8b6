"""check_replay over executions that have not finished: each is replayed up to where its
log ends, runs and consumes nothing, writes nothing, and diverges where resuming it with
the new code would."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from loom_runtime import Context, Loom, ReplayDivergedError, WorkflowNotFoundError
from loom_runtime.testing import VirtualClock, check_replay, crash_at

from loom_core import Event, Storage, open_storage

Body = Callable[..., Awaitable[Any]]
ran: list[str] = []


async def reserve() -> str:
    ran.append("reserve")
    return "reserved"


async def charge() -> str:
    ran.append("charge")
    return "charged"


async def ship() -> str:
    ran.append("ship")
    return "shipped"


async def order(ctx: Context) -> str:
    await ctx.step(reserve)
    await ctx.step(charge)
    await ctx.sleep(3600)
    return await ctx.step(ship)


def app_on(storage: Storage, body: Body, *, timers: bool = True) -> Loom:
    app = Loom(storage, node="n", clock=VirtualClock(), random=random.Random(1),
               recover=False, timers=timers, on_error=lambda exc: None)
    app.workflow(name="order")(body)
    return app


async def left_by(storage: Storage, body: Body, *, crash_before: str | None = None) -> list[Event]:
    """Run ``body`` as execution "o" until it parks (or crashes before the step named),
    and return its log."""
    app = app_on(storage, body)
    if crash_before is not None:
        crash_at(app, step=crash_before)
    async with app:
        await app.start("order", id="o")
        await app.drain()
    ran.clear()
    return list(await storage.events.read("o"))


async def replayed_by(storage: Storage, body: Body) -> list[str]:
    async with app_on(storage, body, timers=False) as app:
        return await check_replay(app)


async def diverged(storage: Storage, body: Body) -> ReplayDivergedError:
    with pytest.raises(ReplayDivergedError) as caught:
        await replayed_by(storage, body)
    return caught.value


async def test_a_parked_execution_replays_up_to_its_park_and_runs_nothing() -> None:
    async with open_storage("memory://") as storage:
        log = await left_by(storage, order)
        assert log[-1].kind == "EXECUTION_SUSPENDED"
        assert await replayed_by(storage, order) == ["o"]
        assert ran == []
        assert list(await storage.events.read("o")) == log


async def test_a_step_renamed_before_the_park_diverges_and_writes_nothing() -> None:
    async def renamed(ctx: Context) -> str:
        await ctx.step(reserve)
        await ctx.step(ship)  # was charge
        await ctx.sleep(3600)
        return await ctx.step(ship)

    async with open_storage("memory://") as storage:
        log = await left_by(storage, order)
        error = await diverged(storage, renamed)
        assert (error.execution_id, error.position) == ("o", "1")
        assert (error.recorded or "").startswith("step 'charge'")
        assert (error.attempted or "").startswith("step 'ship'")
        assert ran == []  # the recorded steps were served, and nothing ran past them
        assert list(await storage.events.read("o")) == log


async def test_code_that_no_longer_makes_the_parks_wait_diverges() -> None:
    async def ends_early(ctx: Context) -> str:
        await ctx.step(reserve)
        await ctx.step(charge)
        return "done"  # the sleep and what followed it removed

    async def receives(ctx: Context) -> str:
        await ctx.step(reserve)
        await ctx.step(charge)
        await ctx.receive("go", timeout=3600)  # was a sleep
        return await ctx.step(ship)

    async with open_storage("memory://") as storage:
        log = await left_by(storage, order)
        error = await diverged(storage, ends_early)
        assert error.position == "2"
        assert (error.recorded or "").startswith("sleep()")
        assert error.attempted == "no call: the body ends completed"
        error = await diverged(storage, receives)
        assert error.position == "2"
        assert (error.attempted or "").startswith("receive('go')")
        assert ran == []
        assert list(await storage.events.read("o")) == log


async def test_a_running_execution_replays_up_to_the_call_it_was_making() -> None:
    async def inserted(ctx: Context) -> str:
        await ctx.step(ship)  # a new first step
        return await order(ctx)

    async def patched(ctx: Context) -> str:
        await ctx.step(reserve)
        if ctx.patched("ship-early"):  # where the log ends: a live run takes the new path
            await ctx.step(ship)
        return await order(ctx)

    async with open_storage("memory://") as storage:
        log = await left_by(storage, order, crash_before="charge")
        assert [e.kind for e in log] == ["EXECUTION_STARTED", "STEP_COMPLETED"]
        assert await replayed_by(storage, order) == ["o"]
        assert ran == []  # charge, where the log ends, was not run
        error = await diverged(storage, inserted)
        assert error.position == "0"
        assert (error.attempted or "").startswith("step 'ship'")
        assert await replayed_by(storage, patched) == ["o"]
        assert ran == []
        assert list(await storage.events.read("o")) == log


async def test_a_message_waiting_for_a_parked_receiver_is_not_consumed() -> None:
    async def waits(ctx: Context) -> Any:
        await ctx.step(reserve)
        return await ctx.receive("go")

    async with open_storage("memory://") as storage:
        log = await left_by(storage, waits)
        # A sender that does not register the workflow only stores the message.
        async with Loom(storage, node="sender", timers=False, recover=False) as sender:
            await sender.send("o", "go", {"n": 1}, key="go-1")
        inbox = list(await storage.events.read("$inbox:o"))
        assert len(inbox) == 1
        assert await replayed_by(storage, waits) == ["o"]
        assert list(await storage.events.read("o")) == log
        assert list(await storage.events.read("$inbox:o")) == inbox


async def test_each_branch_of_a_gather_is_replayed_to_where_it_stopped() -> None:
    async def fan(ctx: Context, first: Body, second: Body) -> object:
        async def left() -> None:
            await ctx.step(first)
            await ctx.sleep(60)

        async def right() -> str:
            return await ctx.step(second)

        return await ctx.gather(left(), right())

    async def same(ctx: Context) -> object:
        return await fan(ctx, reserve, charge)

    async def swapped(ctx: Context) -> object:
        return await fan(ctx, reserve, ship)  # the right branch's step renamed

    async with open_storage("memory://") as storage:
        log = await left_by(storage, same)
        assert log[-1].kind == "EXECUTION_SUSPENDED"
        assert await replayed_by(storage, same) == ["o"]
        error = await diverged(storage, swapped)
        assert error.position == "0.1.0"
        assert ran == []
        assert list(await storage.events.read("o")) == log


async def test_a_branch_that_no_longer_waits_diverges_where_its_wait_was() -> None:
    async def fan(ctx: Context, waits: bool) -> object:
        async def left() -> None:
            await ctx.step(reserve)
            await ctx.sleep(60)

        async def right() -> None:
            if waits:
                await ctx.sleep(120)

        return await ctx.gather(left(), right())

    async def both(ctx: Context) -> object:
        return await fan(ctx, True)

    async def one(ctx: Context) -> object:
        return await fan(ctx, False)

    async with open_storage("memory://") as storage:
        log = await left_by(storage, both)
        assert await replayed_by(storage, both) == ["o"]
        error = await diverged(storage, one)
        assert error.position == "0.1.0"
        assert (error.recorded or "").startswith("sleep()")
        assert error.attempted == "no call: the body parks without waiting for it"
        assert list(await storage.events.read("o")) == log


async def test_finished_and_unfinished_executions_are_replayed_together() -> None:
    async def quick(ctx: Context) -> str:
        return await ctx.step(reserve)

    async with open_storage("memory://") as storage:
        await left_by(storage, order)
        app = app_on(storage, order)
        app.workflow(name="quick")(quick)
        async with app:
            assert await (await app.start("quick", id="done")).result(timeout=5) == "reserved"
            ran.clear()
            assert sorted(await check_replay(app)) == ["done", "o"]
            assert await check_replay(app, ["o", "missing"]) == ["o"]
            assert (await app.inspect("o")).status == "suspended"
        assert ran == []


async def test_an_execution_of_a_workflow_the_app_lacks_says_what_check_replay_needs() -> None:
    """Another app's execution in the same store, or a workflow renamed without its old
    name: WorkflowNotFoundError, saying to register it or to pass this app's ids, which
    then replay."""
    async with open_storage("memory://") as storage:
        await left_by(storage, order)
        other = Loom(storage, node="m", clock=VirtualClock(), recover=False)

        @other.workflow(name="other")
        async def theirs(ctx: Context) -> str:
            return "theirs"

        async with other:
            await other.execute(theirs, id="a-theirs")
        async with app_on(storage, order, timers=False) as app:
            with pytest.raises(WorkflowNotFoundError, match="pass check_replay the ids"):
                await check_replay(app)
            assert await check_replay(app, ["o"]) == ["o"]
