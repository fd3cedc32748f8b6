"""Messages: stored durably before send returns, delivered to their receiver exactly once."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import pytest
from loom_runtime import Context, Handle, Loom, NotJsonError, ReservedExecutionIdError
from loom_runtime.app import SENDER_GRACE
from loom_runtime.inbox import Inbox, Message
from loom_runtime.testing import VirtualClock, crash_at
from loom_runtime.timers import Fired
from store_probes import Wired, kinds, wired

from loom_core import (
    EventKind,
    ExecutionNotFoundError,
    InvalidInputError,
    JsonValue,
    TimerRecord,
)


async def consumed(app: Loom, execution_id: str) -> list[object]:
    return [
        e.payload["value"]  # type: ignore[index,call-overload]
        for e in await app.storage.events.read(execution_id)
        if e.kind == EventKind.MESSAGE_CONSUMED
    ]


async def test_a_parked_receiver_gets_the_message_in_one_append_with_its_resume(
    app: Loom,
) -> None:
    @app.workflow()
    async def wait_for_ship(ctx: Context) -> object:
        return await ctx.receive("shipped")

    handle = await app.start(wait_for_ship, id="r")
    await app.drain()
    assert await handle.status() == "suspended"
    await app.send("r", "shipped", {"carrier": "DHL"}, key="ship-1")
    assert await handle.result(timeout=5) == {"carrier": "DHL"}
    log = await app.storage.events.read("r")
    consumed_at = next(e for e in log if e.kind == EventKind.MESSAGE_CONSUMED)
    resumed_at = log[consumed_at.sequence + 1]
    assert resumed_at.kind == EventKind.EXECUTION_RESUMED
    # One append: both carry the token of the resume that wrote them.
    assert consumed_at.fence == resumed_at.fence == 1
    assert await app.storage.timers.pending("r") == ()


async def test_a_message_sent_before_the_receive_is_consumed_without_parking(
    app: Loom,
) -> None:
    gate = asyncio.Event()

    async def wait_gate() -> None:
        await gate.wait()

    @app.workflow()
    async def late(ctx: Context) -> object:
        await ctx.step(wait_gate)
        return await ctx.receive("go")

    handle = await app.start(late, id="late")
    await app.send("late", "go", 1)
    gate.set()
    assert await handle.result(timeout=5) == 1
    kinds = [e.kind for e in await app.storage.events.read("late")]
    assert EventKind.EXECUTION_SUSPENDED not in kinds


async def test_a_repeated_send_with_the_same_key_is_delivered_once(app: Loom) -> None:
    @app.workflow()
    async def two(ctx: Context) -> list[object]:
        first = await ctx.receive("t")
        second = await ctx.receive("t", timeout=60)
        return [first, second]

    handle = await app.start(two, id="k")
    first = await app.send("k", "t", "a", key="same")
    again = await app.send("k", "t", "a", key="same")
    assert first == again
    await app.drain()
    await app.send("k", "t", "b")
    assert await handle.result(timeout=5) == ["a", "b"]
    assert await consumed(app, "k") == ["a", "b"]


async def test_receive_times_out_with_none(app: Loom, clock: VirtualClock) -> None:
    @app.workflow()
    async def patient(ctx: Context) -> object:
        return await ctx.receive("never", timeout=60)

    handle = await app.start(patient, id="t")
    await app.drain()
    await clock.advance(60)
    assert await handle.result(timeout=5) is None
    # A message that arrives after the timeout is not consumed by this receive.
    await app.send("t", "never", "late")
    assert await consumed(app, "t") == []


async def test_a_receive_whose_timeout_has_passed_goes_on_in_place_with_none(app: Loom) -> None:
    runs: list[int] = []

    @app.workflow()
    async def hasty(ctx: Context) -> object:
        runs.append(1)
        got = await ctx.receive("never", timeout=0)
        return ["timed out", got]

    handle = await app.start(hasty, id="t0")
    assert await handle.result(timeout=5) == ["timed out", None]
    assert runs == [1]  # answered by the run itself, not by a replay
    log = await app.storage.events.read("t0")
    assert [e.kind for e in log] == [
        EventKind.EXECUTION_STARTED,
        EventKind.EXECUTION_SUSPENDED,
        EventKind.EXECUTION_RESUMED,
        EventKind.EXECUTION_COMPLETED,
    ]
    assert log[2].payload["answer"] == {"kind": "timeout"}  # type: ignore[index,call-overload]


async def test_send_refuses_bad_input_and_writes_nothing(app: Loom) -> None:
    @app.workflow()
    async def idle(ctx: Context) -> object:
        return await ctx.receive("x")

    await app.start(idle, id="i")
    await app.drain()
    before = await app.storage.events.read("i")
    with pytest.raises(ExecutionNotFoundError):
        await app.send("nobody", "x", 1)
    with pytest.raises(NotJsonError):
        await app.send("i", "x", {1, 2})
    with pytest.raises(ReservedExecutionIdError):
        await app.send("$inbox:i", "x", 1)
    assert await app.storage.events.read("i") == before
    assert await app.storage.events.head("$inbox:i") == 0
    assert await app.storage.events.head("$inbox:nobody") == 0


async def test_a_message_sent_at_the_instant_an_answered_sleep_woke_is_delivered(
    app: Loom, clock: VirtualClock
) -> None:
    """The send's wake row is written at the sender's now, which here is the wake time of
    the sleep the timer service just answered: the row must not be taken for that
    sleep's and retired while the receiver waits for the message."""

    @app.workflow()
    async def nap_then_read(ctx: Context) -> object:
        await ctx.sleep(30)
        return await ctx.receive("note")

    handle = await app.start(nap_then_read, id="reader")
    await app.drain()
    await clock.advance(30)
    await app.drain()
    assert await handle.status() == "suspended"
    await app.send("reader", "note", "on time")
    await app.drain()
    assert await handle.status() == "completed"
    assert await handle.result(timeout=5) == "on time"
    kinds = [e.kind for e in await app.storage.events.read("reader")]
    assert kinds.count(EventKind.MESSAGE_CONSUMED) == 1


async def test_a_delivered_send_leaves_no_timer_row_behind(app: Loom) -> None:
    @app.workflow()
    async def inbox(ctx: Context) -> object:
        return await ctx.receive("m")

    handle = await app.start(inbox, id="rows")
    await app.drain()
    await app.send("rows", "m", "x")
    assert await handle.result(timeout=5) == "x"
    assert await app.storage.timers.pending("rows") == ()


async def _continued(
    app: Loom, clock: VirtualClock, wanted: int, sent: tuple[int, ...]
) -> Handle[JsonValue]:
    """Start ``chain`` as ``c``: the first generation sleeps, takes one message and
    continues as new; the second takes ``wanted`` more (None where one does not come
    within a minute). ``sent`` is sent while the first sleeps; returns once the sleep is
    over and the app is idle."""

    @app.workflow(name="chain")
    async def chain(ctx: Context, generation: int, got: list[object], wanted: int) -> object:
        if generation == 0:
            await ctx.sleep(10)
            ctx.continue_as_new(1, [await ctx.receive("a")], wanted)
        for _ in range(wanted):
            got.append(await ctx.receive("a", timeout=60))
        return got

    handle = await app.start("chain", 0, [], wanted, id="c")
    await app.drain()
    for n in sent:
        await app.send("c", "a", n)
    await clock.advance(10)
    await app.drain()
    return handle


async def test_messages_an_execution_left_when_it_continued_go_to_its_successor(
    app: Loom, clock: VirtualClock
) -> None:
    handle = await _continued(app, clock, 2, (1, 2, 3))
    assert await handle.result(timeout=5) == [1, 2, 3]
    assert await consumed(app, "c") == [1]
    assert await consumed(app, "c#1") == [2, 3]
    assert app.reported == []  # type: ignore[attr-defined]


async def test_a_message_sent_to_a_continued_execution_reaches_its_successor_once(
    app: Loom, clock: VirtualClock
) -> None:
    handle = await _continued(app, clock, 3, (1, 2))  # 2 is left when it continues
    assert await app.get("c").status() == "continued"
    assert await app.get("c#1").status() == "suspended"
    # Sent to the first generation, after it continued: the successor gets it, once.
    await app.send("c", "a", 3, key="three")
    await app.send("c", "a", 3, key="three")
    await app.drain()
    assert await handle.status() == "continued"
    await clock.advance(60)
    await app.drain()
    assert await handle.result(timeout=5) == [1, 2, 3, None]
    assert await consumed(app, "c#1") == [2, 3]
    assert await app.storage.timers.pending("c#1") == ()
    assert app.reported == []  # type: ignore[attr-defined]


async def test_a_message_sent_while_an_execution_continues_is_handed_on_in_order(
    app: Loom, clock: VirtualClock
) -> None:
    """The sender stores its message after the run that continued read what was left: both
    hand on, each everything left, oldest first, and each message arrives once, in the
    order it was sent."""
    handle = await _continued(app, clock, 3, (1, 2))
    assert await consumed(app, "c#1") == [2]
    await app.send("c", "a", 3)  # finds c continued and hands on 2 (again) and 3
    await app.send("c", "a", 4)
    await app.drain()
    assert await handle.result(timeout=5) == [1, 2, 3, 4]
    inbox = await app.inbox.messages("c#1")
    assert [m.value for m in inbox] == [2, 3, 4]
    assert app.reported == []  # type: ignore[attr-defined]


async def test_messages_left_by_a_run_that_died_after_continuing_are_handed_on_by_recovery(
    app: Loom, clock: VirtualClock
) -> None:
    crash_at(app, step="continue", when="after")
    handle = await _continued(app, clock, 3, (1, 2, 3))
    assert await app.get("c").status() == "continued"
    assert await app.inbox.messages("c#1") == []
    await app.recover()
    await app.drain()
    await clock.advance(60)
    await app.drain()
    assert await handle.result(timeout=5) == [1, 2, 3, None]
    assert app.reported == []  # type: ignore[attr-defined]


async def test_a_sender_hands_on_what_was_left_before_its_own_message(
    app: Loom, clock: VirtualClock
) -> None:
    crash_at(app, step="continue", when="after")  # nothing handed on by the run
    handle = await _continued(app, clock, 3, (1, 2, 3))
    await app.send("c", "a", 4)
    assert [m.value for m in await app.inbox.messages("c#1")] == [2, 3, 4]
    await app.recover()
    await app.drain()
    assert await handle.result(timeout=5) == [1, 2, 3, 4]
    assert [m.value for m in await app.inbox.messages("c#1")] == [2, 3, 4]
    assert app.reported == []  # type: ignore[attr-defined]


async def test_a_key_starting_with_a_dollar_is_refused_and_nothing_is_stored(
    app: Loom,
) -> None:
    @app.workflow()
    async def idle(ctx: Context) -> object:
        return await ctx.receive("x")

    await app.start(idle, id="i")
    await app.drain()
    with pytest.raises(InvalidInputError, match="starting with '\\$'"):
        await app.send("i", "x", 1, key="$from:i:0")
    assert await app.storage.events.head("$inbox:i") == 0


async def test_a_send_whose_delivery_is_contended_returns_and_the_timer_delivers() -> None:
    """The message is stored before delivery is tried: rivals taking the fence three times
    over cannot make ``send`` raise (a sender told it failed would send again, and without
    a key store it twice). The wake row stays due, and the timer service delivers."""
    async with wired() as w:

        @w.app.workflow(name="wait_note")
        async def wait_note(ctx: Context) -> object:
            return await ctx.receive("note")

        await w.app.start("wait_note", id="r")
        await w.app.drain()

        async def rival(execution_id: str) -> None:
            await w.base.events.acquire_fence(execution_id)  # and answers nothing

        w.probe.before_acquire = rival
        sent = await w.app.send("r", "note", "hello")
        assert [m.sequence for m in await w.app.inbox.messages("r")] == [sent]
        assert EventKind.MESSAGE_CONSUMED not in await kinds(w.base.events, "r")
        assert len(await w.base.timers.pending("r")) == 1
        w.probe.before_acquire = None
        await w.app.timer_service.poll_once()
        await w.app.drain()
        assert await w.app.get("r").result(timeout=5) == "hello"
        assert await w.base.timers.pending("r") == ()
        assert w.errors == []


async def test_a_send_from_an_app_without_the_workflow_returns_and_a_worker_delivers(
    app: Loom,
) -> None:
    """A sender that does not run the receiver's workflow (an API process beside the
    workers, say) cannot drive the body on: the message is stored, ``send`` returns its
    id, nothing of the receiver's log is touched, and a node that has the workflow delivers
    it from the wake row."""

    @app.workflow(name="wait_note")
    async def wait_note(ctx: Context) -> object:
        return await ctx.receive("note")

    handle = await app.start("wait_note", id="r")
    await app.drain()
    before = await app.storage.events.read("r")
    errors: list[BaseException] = []
    sender = Loom(app.storage, node="api", timers=False, recover=False, on_error=errors.append)
    async with sender:
        sent = await sender.send("r", "note", "hello")
        assert [m.sequence for m in await sender.inbox.messages("r")] == [sent]
        assert await app.storage.events.read("r") == before
        assert len(await app.storage.timers.pending("r")) == 1
    assert errors == []
    await app.timer_service.poll_once()
    assert await handle.result(timeout=5) == "hello"
    assert await consumed(app, "r") == ["hello"]
    assert await app.storage.timers.pending("r") == ()


class SenderDied(Exception):
    """Stands in for the death of a sender's process at a store call."""


async def _parked_receiver(w: Wired) -> Handle[JsonValue]:
    @w.app.workflow(name="wait_note")
    async def wait_note(ctx: Context) -> object:
        return await ctx.receive("note")

    handle = await w.app.start("wait_note", id="r")
    await w.app.drain()
    return handle


async def test_a_sender_that_dies_after_storing_is_delivered_from_the_row_it_wrote_first() -> (
    None
):
    """A timer service fires a sender's wake row before the message is stored; the sender
    then stores it and dies before it can deliver or write the row again. The row was not
    retired (young, and no stored message names it), so a later poll delivers."""
    async with wired() as w:
        handle = await _parked_receiver(w)
        fired: list[Mapping[TimerRecord, Fired]] = []

        async def timers_fire_first(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id == "$inbox:r" and not fired:
                fired.append(await w.app.timer_service.poll_once())

        async def die(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id == "$inbox:r":
                raise SenderDied

        w.probe.before_append = timers_fire_first
        w.probe.after_append = die
        sender = Loom(w.app.storage, node="api", clock=w.clock, timers=False, recover=False)
        with pytest.raises(SenderDied):
            async with sender:
                await sender.send("r", "note", "hello")
        w.probe.before_append = w.probe.after_append = None
        assert [list(f.values()) for f in fired] == [["left"]]  # the window was hit
        assert len(await w.app.inbox.messages("r")) == 1
        assert len(await w.base.timers.pending("r")) == 1
        # A row left is looked at again after a backoff (from backoff_base, growing).
        assert list((await w.app.timer_service.poll_once()).values()) == ["left"]
        await w.clock.advance(w.app.timer_service.backoff_base)
        await w.app.timer_service.poll_once()
        assert await handle.result(timeout=5) == "hello"
        assert await consumed(w.app, "r") == ["hello"]
        assert await w.base.timers.pending("r") == ()


async def test_two_senders_whose_clocks_read_the_same_each_leave_a_row_of_their_own() -> None:
    """Wake rows are keyed by (execution, instant). Sender B writes its row at the instant
    sender A writes its own; A stores, delivers and retires the row, then B stores and dies
    before it can deliver. B's message names an instant no other message names, with a
    row written for it first, so a timer service still delivers it."""
    async with wired() as w:

        @w.app.workflow(name="wait_two")
        async def wait_two(ctx: Context) -> object:
            return [await ctx.receive("note"), await ctx.receive("note")]

        handle = await w.app.start("wait_two", id="r")
        await w.app.drain()
        a_sent: list[bool] = []

        async def a_sends_first(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id == "$inbox:r" and a_sent == []:
                a_sent.append(False)
                await w.app.send("r", "note", "from a")  # stored, delivered, row retired
                a_sent[0] = True

        async def b_dies(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id == "$inbox:r" and a_sent == [True]:
                raise SenderDied

        w.probe.before_append = a_sends_first
        w.probe.after_append = b_dies
        b = Loom(w.app.storage, node="api", clock=w.clock, timers=False, recover=False)
        with pytest.raises(SenderDied):
            async with b:
                await b.send("r", "note", "from b")
        w.probe.before_append = w.probe.after_append = None
        await w.app.drain()
        assert await consumed(w.app, "r") == ["from a"]  # the window was hit
        assert len(await w.app.inbox.messages("r")) == 2
        await w.app.timer_service.poll_once()
        assert await handle.result(timeout=5) == ["from a", "from b"]
        assert await w.base.timers.pending("r") == ()


async def test_a_senders_row_whose_message_never_came_is_retired_after_the_grace() -> None:
    """A sender that dies between its row and its message leaves a row that names nothing:
    timer services leave it while it is younger than SENDER_GRACE, then retire it, and the
    receiver stays parked on its receive."""
    async with wired() as w:
        handle = await _parked_receiver(w)

        async def die(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id == "$inbox:r":
                raise SenderDied

        w.probe.before_append = die
        sender = Loom(w.app.storage, node="api", clock=w.clock, timers=False, recover=False)
        with pytest.raises(SenderDied):
            async with sender:
                await sender.send("r", "note", "hello")
        w.probe.before_append = None
        assert await w.app.inbox.messages("r") == []
        assert list((await w.app.timer_service.poll_once()).values()) == ["left"]
        await w.clock.advance(SENDER_GRACE)
        assert list((await w.app.timer_service.poll_once()).values()) == ["obsolete"]
        assert await w.base.timers.pending("r") == ()
        assert await handle.status() == "suspended"
        assert EventKind.MESSAGE_CONSUMED not in await kinds(w.base.events, "r")


async def test_a_wake_row_retired_before_its_message_was_stored_is_written_again() -> None:
    """A sender writes the wake row, then stores the message. A worker's timer service that
    fires the row in between, once the row is older than SENDER_GRACE (the sender stalled),
    finds nothing to answer and retires it; a sender that cannot deliver itself (it does
    not run the workflow, or rivals hold the fence) must then write the row again, or the
    stored message waits for nothing."""
    async with wired() as w:

        @w.app.workflow(name="wait_note")
        async def wait_note(ctx: Context) -> object:
            return await ctx.receive("note")

        handle = await w.app.start("wait_note", id="r")
        await w.app.drain()
        fired: list[Mapping[TimerRecord, Fired]] = []

        async def timers_fire_first(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id == "$inbox:r" and not fired:
                await w.clock.advance(SENDER_GRACE)
                fired.append(await w.app.timer_service.poll_once())

        w.probe.before_append = timers_fire_first
        sender = Loom(w.app.storage, node="api", clock=w.clock, timers=False, recover=False)
        async with sender:
            await sender.send("r", "note", "hello")
        w.probe.before_append = None
        assert [list(f.values()) for f in fired] == [["obsolete"]]  # the window was hit
        assert len(await w.base.timers.pending("r")) == 1
        await w.app.timer_service.poll_once()
        assert await handle.result(timeout=5) == "hello"
        assert await w.base.timers.pending("r") == ()


async def test_a_wake_row_retired_after_its_sender_wrote_it_again_is_put_back() -> None:
    """The retirement of a row fired before its message was stored (once older than
    SENDER_GRACE) can land after the sender wrote the row again (same key): the timer
    service looks again after retiring, and puts the row back when a message waits."""
    async with wired() as w:

        @w.app.workflow(name="wait_note")
        async def wait_note(ctx: Context) -> object:
            return await ctx.receive("note")

        handle = await w.app.start("wait_note", id="r")
        await w.app.drain()
        timers = w.app.storage.timers
        complete = timers.complete
        at_retire, go = asyncio.Event(), asyncio.Event()
        poll: list[asyncio.Future[dict[TimerRecord, Fired]]] = []

        async def held_complete(execution_id: str, wake_at: datetime) -> None:
            at_retire.set()
            await go.wait()
            await complete(execution_id, wake_at)

        async def timers_fire_first(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id == "$inbox:r" and not poll:
                await w.clock.advance(SENDER_GRACE)
                poll.append(asyncio.ensure_future(w.app.timer_service.poll_once()))
                await at_retire.wait()  # it found nothing to answer, and retires the row

        w.probe.before_append = timers_fire_first
        timers.complete = held_complete  # type: ignore[method-assign,assignment]
        sender = Loom(w.app.storage, node="api", clock=w.clock, timers=False, recover=False)
        async with sender:
            await sender.send("r", "note", "hello")  # stored, and its row written again
        w.probe.before_append = None
        go.set()
        assert list((await poll[0]).values()) == ["obsolete"]
        timers.complete = complete  # type: ignore[method-assign]
        assert len(await w.base.timers.pending("r")) == 1
        await w.app.timer_service.poll_once()
        assert await handle.result(timeout=5) == "hello"
        assert await w.base.timers.pending("r") == ()


async def test_a_message_sent_to_the_first_of_a_long_chain_reaches_its_live_generation(
    app: Loom,
) -> None:
    """A message goes down a continue-as-new chain hop by hop, in a loop: a chain longer
    than Python's recursion limit allows calls for (about 330 generations, three frames
    each) still gets it, and nothing is reported."""

    @app.workflow(name="countdown")
    async def countdown(ctx: Context, left: int) -> object:
        if left:
            ctx.continue_as_new(left - 1)
        return await ctx.receive("go")

    generations = 400
    handle = await app.start(countdown, generations, id="k")
    await app.drain()
    assert await app.get(f"k#{generations}").status() == "suspended"
    await app.send("k", "go", "at last")
    assert await handle.result(timeout=5) == "at last"
    assert await consumed(app, f"k#{generations}") == ["at last"]
    assert app.reported == []  # type: ignore[attr-defined]


async def test_many_sends_of_one_process_to_one_inbox_queue_rather_than_fail(
    tmp_path: Path,
) -> None:
    """A hundred concurrent sends to one execution from one process: each is stored, and
    each delivered once. (The senders of one process wait for each other's append rather
    than race for the inbox's next sequence, where only so many tries are made.)"""
    app = Loom(f"sqlite:///{tmp_path / 'fan-in.db'}", node="n", clock=VirtualClock())

    @app.workflow(name="fan_in")
    async def fan_in(ctx: Context, n: int) -> int:
        total = 0
        for _ in range(n):
            value = await ctx.receive("done")
            assert isinstance(value, int)
            total += value
        return total

    async with app:
        handle = await app.start(fan_in, 100, id="parent")
        ids = await asyncio.gather(
            *(app.send("parent", "done", i, key=f"child-{i}") for i in range(100))
        )
        assert sorted(ids) == list(range(100))
        assert await handle.result(timeout=30) == sum(range(100))
        assert sorted(await consumed(app, "parent")) == list(range(100))  # type: ignore[type-var]


async def test_the_messages_an_ended_execution_received_are_not_kept() -> None:
    """What the app read of an inbox (each message's value) went only when 1024 later
    inboxes had pushed it out: a worker held the messages of the last 1024 executions
    that received any, finished, for good. It goes when the execution ends here
    (completed, cancelled, continued as new)."""
    app = Loom("memory://", node="n1", clock=VirtualClock())

    @app.workflow()
    async def collect(ctx: Context, n: int) -> int:
        for _ in range(n):
            await ctx.receive("item")
        return n

    @app.workflow()
    async def relay(ctx: Context, generation: int) -> int:
        await ctx.receive("item")
        if generation < 2:
            ctx.continue_as_new(generation + 1)
        return generation

    def messages_held() -> int:
        gc.collect()
        return sum(isinstance(o, Message) for o in gc.get_objects())

    async with app:
        for i in range(5):
            handle = await app.start(collect, 3, id=f"collect-{i}")
            for j in range(3):
                await app.send(f"collect-{i}", "item", {"n": j, "blob": "x" * 1000})
            assert await handle.result(timeout=5) == 3
        chain = await app.start(relay, 0, id="relay")
        for j in range(3):
            await app.send("relay", "item", j)
        assert await chain.result(timeout=5) == 2
        cancelled = await app.start(collect, 3, id="cancelled")
        await app.send("cancelled", "item", 1)
        await app.send("cancelled", "other", 2)
        await app.drain()
        assert await cancelled.cancel()
        await app.drain()
        assert messages_held() == 0


@pytest.mark.parametrize("pruned", ["before its message is stored", "after"])
async def test_a_send_that_a_prune_overtakes_is_refused_and_leaves_no_inbox(
    app: Loom, monkeypatch: pytest.MonkeyPatch, pruned: str
) -> None:
    @app.workflow()
    async def idle(ctx: Context) -> object:
        return await ctx.receive("never")

    await app.start(idle, id="p")
    await app.drain()
    await app.send("p", "other", 1)  # an inbox the prune deletes too
    events = app.storage.events

    async def prune() -> None:  # as docs/runtime.md says: the log, then its inbox
        await events.delete_execution("p")
        await events.delete_execution("$inbox:p")

    # The send has found the log; the prune runs before the send stores its message (as
    # its wake row is written), or right after.
    if pruned == "after":
        put = Inbox.put

        async def put_then_prune(inbox: Inbox, *args: object, **kwargs: object) -> Message:
            stored = await put(inbox, *args, **kwargs)  # type: ignore[arg-type]
            await prune()
            return stored

        monkeypatch.setattr(Inbox, "put", put_then_prune)
    else:
        schedule_wake = app.schedule_wake

        async def prune_then_wake(row: TimerRecord) -> None:
            await prune()
            await schedule_wake(row)

        monkeypatch.setattr(app, "schedule_wake", prune_then_wake)
    with pytest.raises(ExecutionNotFoundError, match="'p'"):
        await app.send("p", "never", 2)
    assert await events.head("$inbox:p") == 0
    assert await events.head("p") == 0
    assert await app.storage.timers.pending("p") == ()


async def test_an_inbox_a_sender_left_after_a_prune_goes_with_its_wake_row(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def idle(ctx: Context) -> object:
        return await ctx.receive("never")

    await app.start(idle, id="p")
    await app.drain()
    events = app.storage.events
    await events.delete_execution("p")
    await events.delete_execution("$inbox:p")
    # What a sender that found the log before the prune, and died once it had stored its
    # message after it, leaves: its wake row and the inbox its message made anew.
    row = TimerRecord("p", clock.now())
    await app.storage.timers.schedule(row)
    await app.inbox.put("p", "never", 2, None, wake_at=row.wake_at)
    assert await app.timer_service.poll_once() == {row: "obsolete"}
    assert await events.head("$inbox:p") == 0
    assert await app.storage.timers.pending("p") == ()
