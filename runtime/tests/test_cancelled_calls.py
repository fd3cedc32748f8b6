"""A call cancelled with a write of the app in flight, a step or a body that raises a
cancellation of its own, and an app that leaves while an ``execute`` runs elsewhere: no
execution is left running with nothing to drive it.

Each window is held open by the probe's hooks (a write that has landed and whose caller
has not heard back yet, or one that has not reached the store), never by a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from loom_runtime import (
    AppNotRunningError,
    Context,
    ExecutionCancelledError,
    Loom,
    StepFailedError,
    WorkflowFailedError,
)
from loom_runtime.app import CARRY_ON_AFTER
from loom_runtime.records import MESSAGE_KIND, inbox_of
from loom_runtime.testing import crash_at
from store_probes import ProbedEventStore, Wired, kinds, wired

from loom_core import (
    EventKind,
    StaleFenceError,
    Storage,
    StorageUnavailableError,
    open_storage,
)


class Gate:
    """Holds a store call until released, and says when one is held."""

    def __init__(self, *holding: str) -> None:
        self.holding = set(holding)
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, execution_id: str, written: tuple[str, ...]) -> None:
        if self.holding & set(written) and not self.release.is_set():
            self.held.set()
            await self.release.wait()


async def _cancelled(call: asyncio.Task[Any], gate: Gate) -> None:
    """Cancel ``call`` while ``gate`` holds its write, then let the write's reply go."""
    await gate.held.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    gate.release.set()


Start = Callable[[Loom, Any, str], Coroutine[Any, Any, object]]


async def _start(app: Loom, workflow: Any, execution_id: str) -> object:
    return await app.start(workflow, id=execution_id)


async def _execute(app: Loom, workflow: Any, execution_id: str) -> object:
    return await app.execute(workflow, id=execution_id)


def one_charge(app: Loom) -> tuple[list[str], Any]:
    """Register ``order``, one step that charges; what the step ran, and the workflow."""
    ran: list[str] = []

    async def charge() -> str:
        ran.append("charge")
        return "charged"

    @app.workflow()
    async def order(ctx: Context) -> str:
        return await ctx.step(charge)

    return ran, order


async def charged_once_after_a_takeover(w: Wired, ran: list[str]) -> None:
    """``o`` finished, taken over by the app, its step run once."""
    assert await w.app.get("o").result(timeout=5) == "charged"
    assert ran == ["charge"]
    assert await kinds(w.base.events, "o") == [
        EventKind.EXECUTION_STARTED,
        EventKind.EXECUTION_RECOVERED,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_COMPLETED,
    ]


@pytest.mark.parametrize("call", [_start, _execute], ids=["start", "execute"])
async def test_a_call_cancelled_after_its_first_write_landed_is_driven_by_the_app(
    call: Start,
) -> None:
    async with wired() as w:
        ran, order = one_charge(w.app)
        gate = Gate(EventKind.EXECUTION_STARTED)
        w.probe.after_append = gate
        await _cancelled(asyncio.create_task(call(w.app, order, "o")), gate)
        await charged_once_after_a_takeover(w, ran)
        assert w.errors == []


@pytest.mark.parametrize("call", [_start, _execute], ids=["start", "execute"])
async def test_a_take_back_the_store_fails_is_stranded_and_carried_on_when_it_answers(
    call: Start,
) -> None:
    async with wired() as w:
        ran, order = one_charge(w.app)
        down = StorageUnavailableError("the database is down")

        def unreadable(execution_id: str) -> None:
            raise down

        gate = Gate(EventKind.EXECUTION_STARTED)
        w.probe.after_append = gate
        await gate_then_fail(w, gate, unreadable, asyncio.create_task(call(w.app, order, "o")))
        assert w.app.stranded == {"o"}
        assert w.errors == []  # a store failure: on_storage_error's, not on_error's
        w.probe.after_read = None
        await w.clock.advance(CARRY_ON_AFTER)
        await charged_once_after_a_takeover(w, ran)
        assert w.app.stranded == frozenset()


async def gate_then_fail(
    w: Wired, gate: Gate, failing: Callable[[str], None], call: asyncio.Task[Any]
) -> None:
    """Cancel ``call`` while ``gate`` holds its write's reply, with every read failing
    (``failing``) from then on, and let the app's take-back meet the failure."""
    await gate.held.wait()
    w.probe.after_read = failing
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    gate.release.set()
    await w.app.drain()


async def test_a_start_cancelled_before_its_write_reached_the_store_leaves_nothing() -> None:
    async with wired() as w:

        @w.app.workflow()
        async def order(ctx: Context) -> str:
            return "done"

        gate = Gate(EventKind.EXECUTION_STARTED)
        w.probe.before_append = gate
        await _cancelled(asyncio.create_task(w.app.start(order, id="o")), gate)
        await w.app.drain()
        assert await w.base.events.head("o") == 0
        # The id is free: a start takes it (under a token newer than the take-back's).
        w.probe.before_append = None
        assert await (await w.app.start(order, id="o")).result(timeout=5) == "done"
        assert w.errors == []


async def test_a_start_cancelled_after_another_node_started_the_id_takes_no_token() -> None:
    """A start whose write is in flight when another node starts the same id (a request
    that timed out, retried on another web node) and is then cancelled: its write can no
    longer land, so its take-back takes no token. One would fence the other node's run out
    mid-step and carry it on here, running the step on two nodes at once."""
    async with wired() as w:
        ran: list[str] = []
        in_step, finish = asyncio.Event(), asyncio.Event()

        async def slow(node: str) -> str:
            ran.append(node)
            if len(ran) == 1:  # the first run's step is held; a second one's goes through
                in_step.set()
                await finish.wait()
            return node

        async def order(ctx: Context, node: str) -> str:
            return await ctx.step(slow, node)

        w.app.workflow(name="order")(order)
        other = Loom(w.base, node="web-2", clock=w.clock, timers=False, recover=False)
        other.workflow(name="order")(order)
        async with other:
            gate = Gate(EventKind.EXECUTION_STARTED)

            async def the_other_starts_first(execution_id: str, written: tuple[str, ...]) -> None:
                if not gate.held.is_set():
                    await other.start("order", "web-2", id="o")
                    await in_step.wait()  # its run is in its step
                await gate(execution_id, written)

            w.probe.before_append = the_other_starts_first
            await _cancelled(asyncio.create_task(w.app.start("order", "n1", id="o")), gate)
            await w.app.drain()
            assert w.probe.of("acquire_fence", "acquire_fence_if") == []
            finish.set()
            assert await other.get("o").result(timeout=5) == "web-2"
            assert ran == ["web-2"]
            assert w.errors == []


@pytest.mark.parametrize("cut", ["cancelled", "store-failed"])
async def test_a_cancel_cut_short_after_its_token_leaves_the_execution_driven(cut: str) -> None:
    """``app.cancel`` of a running execution takes a token (fencing the run out), then
    appends EXECUTION_CANCELLED. Cut between the two (its caller cancelled once the token
    landed, or the store failing the append), it must not leave the execution running
    with its run fenced out and nothing to drive it: the app carries it on."""
    async with wired() as w:
        ran: list[str] = []
        in_step, finish = asyncio.Event(), asyncio.Event()

        async def slow() -> str:
            ran.append("slow")
            in_step.set()
            await finish.wait()
            return "slow"

        @w.app.workflow()
        async def order(ctx: Context) -> str:
            return await ctx.step(slow)

        handle = await w.app.start(order, id="o")
        await in_step.wait()
        acquire = w.probe.acquire_fence
        landed, hold = asyncio.Event(), asyncio.Event()

        async def token_lands_then_the_reply_waits(execution_id: str) -> int:
            token = await acquire(execution_id)
            landed.set()
            await hold.wait()
            return token

        async def the_store_fails(execution_id: str, kinds: tuple[str, ...]) -> None:
            if EventKind.EXECUTION_CANCELLED in kinds:
                raise StorageUnavailableError("the disk is gone")

        if cut == "cancelled":
            w.probe.acquire_fence = token_lands_then_the_reply_waits  # type: ignore[method-assign]
            call = asyncio.create_task(w.app.cancel("o"))
            await landed.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            w.probe.acquire_fence = acquire  # type: ignore[method-assign]
            hold.set()
        else:
            w.probe.before_append = the_store_fails
            with pytest.raises(StorageUnavailableError):
                await w.app.cancel("o")
            w.probe.before_append = None
        finish.set()
        assert await handle.result(timeout=5) == "slow"
        assert EventKind.EXECUTION_CANCELLED not in await kinds(w.base.events, "o")
        assert w.errors == []


async def test_an_execute_cancelled_while_its_run_answers_its_own_park_is_driven() -> None:
    """An ``execute`` whose body parks on a due wait answers the park itself; cancelled
    while that answer is in flight, and the store completing the write after the caller
    stopped waiting (a store's own worker), the answer must not land behind the app's
    back: the app's take-back takes a token first, and the execution finishes once."""
    async with wired() as w:
        ran: list[str] = []

        async def work() -> str:
            ran.append("work")
            return "done"

        @w.app.workflow()
        async def nap_then_work(ctx: Context) -> str:
            await ctx.sleep(0)
            return await ctx.step(work)

        append = w.probe.append
        held, release = asyncio.Event(), asyncio.Event()
        late: list[asyncio.Future[object]] = []

        async def lands_later(execution_id: str, events: Any, **options: Any) -> Any:
            if any(e.kind == EventKind.EXECUTION_RESUMED for e in events) and not late:

                async def write() -> object:
                    await release.wait()
                    return await append(execution_id, events, **options)

                late.append(asyncio.ensure_future(write()))  # the store's own worker
                held.set()
                return await asyncio.shield(late[0])
            return await append(execution_id, events, **options)

        w.probe.append = lands_later  # type: ignore[method-assign]
        call = asyncio.create_task(w.app.execute(nap_then_work, id="e"))
        await held.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await w.app.drain()  # the take-back has looked, and taken its token
        release.set()
        with pytest.raises(StaleFenceError):
            await late[0]  # the answer in flight can no longer land
        w.probe.append = append  # type: ignore[method-assign]
        await w.app.timer_service.poll_once()
        assert await w.app.get("e").result(timeout=5) == "done"
        assert ran == ["work"]
        assert (await kinds(w.base.events, "e")).count(EventKind.EXECUTION_RESUMED) == 1


async def test_a_send_cancelled_after_its_answer_landed_leaves_the_receiver_driven() -> None:
    async with wired() as w:

        @w.app.workflow()
        async def listen(ctx: Context) -> object:
            return await ctx.receive("go", timeout=600)

        handle = await w.app.start(listen, id="l")
        await w.app.drain()
        assert await handle.status() == "suspended"
        gate = Gate(EventKind.EXECUTION_RESUMED)
        w.probe.after_append = gate
        await _cancelled(asyncio.create_task(w.app.send("l", "go", {"n": 1})), gate)
        assert await handle.result(timeout=5) == {"n": 1}
        log = await kinds(w.base.events, "l")
        assert log.count(EventKind.MESSAGE_CONSUMED) == 1
        assert log.count(EventKind.EXECUTION_RESUMED) == 1
        assert w.errors == []


@pytest.mark.parametrize("held", [MESSAGE_KIND, EventKind.EXECUTION_RESUMED])
async def test_a_send_whose_message_is_stored_as_the_app_is_left_returns_its_id(
    held: str,
) -> None:
    # The app is left while the send's message is stored (held after the message, or
    # after the answer to the park): the send returns the message's id, as a send that
    # raised would be sent again by its caller, twice without a key; the wake row left due
    # has the next start deliver it, once.
    async with await open_storage("memory://") as base:  # outlives both apps
        probe = ProbedEventStore(base.events)
        storage = Storage(probe, base.timers, base.leases, url=base.url)

        async def listen(ctx: Context) -> object:
            return await ctx.receive("go", timeout=600)

        first = Loom(storage, node="n1", timers=False, recover=False)
        first.workflow(name="listen")(listen)
        async with first:
            await first.start(listen, id="l")
            await first.drain()
            gate = Gate(held)
            probe.after_append = gate
            send = asyncio.create_task(first.send("l", "go", {"n": 1}))
            await gate.held.wait()
        gate.release.set()
        assert await send == 0
        again = Loom(storage, node="n1")
        again.workflow(name="listen")(listen)
        async with again:
            assert await again.get("l").result(timeout=5) == {"n": 1}
        assert await kinds(base.events, inbox_of("l")) == [MESSAGE_KIND]
        assert (await kinds(base.events, "l")).count(EventKind.MESSAGE_CONSUMED) == 1


@pytest.mark.parametrize("held", [MESSAGE_KIND, EventKind.EXECUTION_RESUMED])
async def test_a_send_whose_message_is_stored_as_its_storage_closes_returns_its_id(
    held: str, tmp_path: Path
) -> None:
    # As above, with the storage closed under the send as well (an app opened from a URL
    # closes its own as it is left): StoreClosedError would say that nothing was done.
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    base = await open_storage(url)
    probe = ProbedEventStore(base.events)
    storage = Storage(probe, base.timers, base.leases, url=base.url, on_close=base.close)

    async def listen(ctx: Context) -> object:
        return await ctx.receive("go", timeout=600)

    first = Loom(storage, node="n1", timers=False, recover=False)
    first.workflow(name="listen")(listen)
    async with first:
        await first.start(listen, id="l")
        await first.drain()
        gate = Gate(held)
        probe.after_append = gate
        send = asyncio.create_task(first.send("l", "go", {"n": 1}))
        await gate.held.wait()
    await storage.close()
    gate.release.set()
    assert await send == 0
    again = Loom(url, node="n1")
    again.workflow(name="listen")(listen)
    async with again:
        assert await again.get("l").result(timeout=5) == {"n": 1}
        assert await kinds(again.storage.events, inbox_of("l")) == [MESSAGE_KIND]
        assert (await kinds(again.storage.events, "l")).count(EventKind.MESSAGE_CONSUMED) == 1


async def test_an_execute_cancelled_as_it_continues_leaves_its_successor_driven() -> None:
    async with wired() as w:

        @w.app.workflow()
        async def relay(ctx: Context, generation: int) -> int:
            if generation == 0:
                ctx.continue_as_new(1)
            return generation

        gate = Gate(EventKind.EXECUTION_CONTINUED)
        w.probe.after_append = gate
        await _cancelled(asyncio.create_task(w.app.execute(relay, 0, id="r")), gate)
        assert await w.app.get("r").result(timeout=5) == 1
        assert await w.app.get("r#1").status() == "completed"
        assert w.errors == []


async def test_leaving_the_app_stops_an_execute_running_in_another_task() -> None:
    async with await open_storage("memory://") as storage:  # outlives the app
        app = Loom(storage, node="n1", timers=False, recover=False)
        in_step, finish = asyncio.Event(), asyncio.Event()
        ran: list[str] = []

        async def slow() -> str:
            in_step.set()
            await finish.wait()
            return "slow"

        async def after() -> str:
            ran.append("after")
            return "after"

        @app.workflow()
        async def flow(ctx: Context) -> list[str]:
            return [await ctx.step(slow), await ctx.step(after)]

        async with app:
            call = asyncio.create_task(app.execute(flow, id="f"))
            await in_step.wait()
        finish.set()
        with pytest.raises(AppNotRunningError, match="execute was cut short: the app was left"):
            await call
        assert ran == []
        assert await kinds(storage.events, "f") == [EventKind.EXECUTION_STARTED]


async def test_a_step_that_raises_a_cancellation_of_its_own_fails_as_a_step(app: Loom) -> None:
    async def fetch() -> str:
        cancelled: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        cancelled.cancel()  # someone else's future, cancelled: not this run's cancellation
        return await cancelled

    @app.workflow()
    async def flow(ctx: Context) -> str:
        try:
            await ctx.step(fetch)
        except StepFailedError as exc:
            return exc.error_type
        return "fetched"

    assert await app.execute(flow, id="f") == "asyncio.exceptions.CancelledError"
    assert EventKind.STEP_FAILED in [e.kind for e in await app.storage.events.read("f")]


async def test_a_body_that_raises_a_cancellation_of_its_own_fails(app: Loom) -> None:
    @app.workflow()
    async def gives_up(ctx: Context) -> None:
        raise asyncio.CancelledError("not the run's")

    handle = await app.start(gives_up, id="g")
    with pytest.raises(WorkflowFailedError, match="CancelledError: not the run's"):
        await handle.result(timeout=5)
    assert await handle.status() == "failed"


async def test_a_failure_whose_text_cannot_be_made_still_fails_the_execution(app: Loom) -> None:
    class Mute(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no words")

    @app.workflow()
    async def mute(ctx: Context) -> None:
        raise Mute()

    handle = await app.start(mute, id="m")
    with pytest.raises(WorkflowFailedError, match="raised RuntimeError"):
        await handle.result(timeout=5)


async def test_a_cancel_that_lands_while_a_run_continues_cancels_the_successor_too() -> None:
    async with wired() as w:

        @w.app.workflow()
        async def relay(ctx: Context, generation: int) -> object:
            if generation == 0:
                ctx.continue_as_new(1)
            return await ctx.receive("never")

        # The successor exists; the run is about to record its continuation.
        gate = Gate(EventKind.EXECUTION_CONTINUED)
        w.probe.before_append = gate
        handle = await w.app.start(relay, 0, id="r")
        await gate.held.wait()
        assert await w.app.cancel("r") is True  # fences the run out
        gate.release.set()
        await w.app.drain()
        assert await handle.status() == "cancelled"
        assert await w.app.get("r#1").status() == "cancelled"
        assert await kinds(w.base.events, "r#1") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_CANCELLED,
        ]


_SPAWNED_BY: dict[str, str] = {
    "start": EventKind.EXECUTION_STARTED,
    "answer": EventKind.EXECUTION_RESUMED,
    "continuation": EventKind.EXECUTION_CONTINUED,
    "takeover": EventKind.EXECUTION_RECOVERED,
}


@pytest.mark.parametrize("write", list(_SPAWNED_BY))
async def test_a_cancel_that_lands_before_the_run_a_write_spawns_stops_it_before_any_step(
    write: str,
) -> None:
    """The write after which this process spawns the execution's next run (its start, the
    answer of a message, the continuation that hands its successor on, a recovery's
    takeover) has landed, and
    its caller has not heard back: a cancel there stops that run before its body makes a
    call, so no step runs for an execution already cancelled."""
    async with wired() as w:
        ran: list[int] = []

        def effect(generation: int) -> int:
            ran.append(generation)
            return generation

        @w.app.workflow()
        async def relay(ctx: Context, generation: int) -> int:
            if write == "continuation" and generation == 0:
                ctx.continue_as_new(1)
            if write == "answer":
                await ctx.receive("go")
            return await ctx.step(effect, generation, name="effect")

        gate = Gate(_SPAWNED_BY[write])
        if write == "answer":
            await w.app.start(relay, 0, id="r")
            await w.app.drain()
            w.probe.after_append = gate
            call: asyncio.Task[object] = asyncio.create_task(w.app.send("r", "go"))
        elif write == "takeover":
            crash_at(w.app, step="effect")  # the run dies before its step: a node restarts
            await w.app.start(relay, 0, id="r")
            await w.app.drain()
            w.probe.after_append = gate
            call = asyncio.create_task(w.app.recover())
        else:
            w.probe.after_append = gate
            call = asyncio.create_task(w.app.start(relay, 0, id="r"))
        await gate.held.wait()
        assert await w.app.cancel("r") is True
        gate.release.set()
        await call
        await w.app.drain()
        with pytest.raises(ExecutionCancelledError):
            await w.app.get("r").result(timeout=5)
        assert ran == []
        assert w.errors == []


@pytest.mark.parametrize("call", [_start, _execute], ids=["start", "execute"])
async def test_calls_cancelled_at_every_turn_on_sqlite_leave_nothing_undriven(
    call: Start, tmp_path: Path
) -> None:
    """The deterministic windows above, on a real store: 240 calls, each cancelled after 0
    to 11 turns of the loop (as ``asyncio.wait_for`` running out does), with SQLite's
    writer thread completing writes whose callers stopped waiting. Whatever each
    cancellation cut, every execution that was written finishes."""
    app = Loom(f"sqlite:///{tmp_path}/cut.db", node="n1", timers=False, recover=False)

    async def work() -> str:
        return "done"

    @app.workflow()
    async def flow(ctx: Context) -> str:
        return await ctx.step(work)

    async def cut(execution_id: str, turns: int) -> None:
        task = asyncio.create_task(call(app, flow, execution_id))
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    ids = [f"c-{i}" for i in range(240)]
    async with app:
        await asyncio.gather(*(cut(execution_id, i % 12) for i, execution_id in enumerate(ids)))
        await app.drain()  # the takeovers the cancellations left are the app's tasks
        statuses = [(await app.inspect(execution_id)).status for execution_id in ids]
        assert {status for status in statuses} <= {None, "completed"}, [
            (execution_id, status)
            for execution_id, status in zip(ids, statuses, strict=True)
            if status not in (None, "completed")
        ][:5]
        assert statuses.count("completed") > 0


@pytest.mark.parametrize("before", ["a step", "nothing"])
async def test_a_cancel_by_another_process_stops_the_run_at_its_next_write(before: str) -> None:
    """Another process cancels an execution this one drives, between two calls of its
    body. The run hears of it at its next write: a step after another step writes that
    one's result first, so it never runs; a step with nothing to write before it (the
    first of a run) runs once, and its result is not recorded."""
    async with open_storage("memory://") as storage:
        ran: list[str] = []
        between = asyncio.Event()
        go_on = asyncio.Event()

        def effect(name: str) -> str:
            ran.append(name)
            return name

        async def relay(ctx: Context) -> None:
            if before == "a step":
                await ctx.step(effect, "first", name="first")
            between.set()
            await go_on.wait()  # the test's hold between two calls, not a durable wait
            await ctx.step(effect, "second", name="second")

        driving = Loom(storage, node="a", timers=False, recover=False)
        cancelling = Loom(storage, node="b", timers=False, recover=False)
        for app in (driving, cancelling):
            app.workflow(name="relay")(relay)
        async with driving, cancelling:
            handle = await driving.start("relay", id="r")
            await between.wait()
            assert await cancelling.cancel("r") is True
            go_on.set()
            await driving.drain()
            with pytest.raises(ExecutionCancelledError):
                await handle.result(timeout=5)
        log = await storage.events.read("r")
        assert [e.kind for e in log][-1] == EventKind.EXECUTION_CANCELLED
        recorded = [e.payload["name"] for e in log  # type: ignore[index,call-overload]
                    if e.kind == EventKind.STEP_COMPLETED]
        if before == "a step":
            assert ran == ["first"]  # the second step's flush of the first's result is fenced
            assert recorded == []  # the first's result was pending when the cancel landed
        else:
            assert ran == ["second"]  # run once, after the cancel landed
            assert recorded == []
