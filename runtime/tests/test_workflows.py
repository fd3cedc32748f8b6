"""A workflow's life on the embedded store: steps recorded once, replayed from the log."""

from __future__ import annotations

import contextvars
import copy
import enum
import gc
import pickle
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from loom_runtime import (
    Context,
    Loom,
    NotJsonError,
    Retry,
    StepFailedError,
    View,
    WorkflowFailedError,
)
from loom_runtime.app import MAX_NEW_ID_BYTES
from loom_runtime.testing import VirtualClock, check_replay, crash_at
from store_probes import wired

from loom_core import (
    EventKind,
    ExecutionAlreadyExistsError,
    InvalidInputError,
    Storage,
    open_storage,
)
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore
from loom_core.spi import MAX_EVENTS_PER_APPEND


async def kinds(app: Loom, execution_id: str) -> list[str]:
    return [e.kind for e in await app.storage.events.read(execution_id)]


async def test_steps_run_once_and_the_result_is_recorded(app: Loom) -> None:
    ran: list[str] = []

    async def reserve(order: str) -> dict[str, str]:
        ran.append(order)
        return {"reserved": order}

    @app.workflow()
    async def checkout(ctx: Context, order: str) -> dict[str, Any]:
        reserved = await ctx.step(reserve, order)
        return {"reserved": reserved}

    handle = await app.start(checkout, "o-1", id="order-1")
    assert await handle.result(timeout=5) == {"reserved": {"reserved": "o-1"}}
    assert ran == ["o-1"]
    assert await kinds(app, "order-1") == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_COMPLETED,
    ]
    assert await handle.status() == "completed"


async def test_a_crashed_run_is_recovered_and_recorded_steps_do_not_run_again(app: Loom) -> None:
    ran: list[str] = []

    async def one() -> int:
        ran.append("one")
        return 1

    async def two() -> int:
        ran.append("two")
        return 2

    @app.workflow()
    async def flow(ctx: Context) -> int:
        return await ctx.step(one) + await ctx.step(two)

    crash = crash_at(app, step="two", when="before")
    handle = await app.start(flow, id="f")
    await crash.fired.wait()
    await app.drain()
    assert await handle.status() == "running"
    assert ran == ["one"]
    recovered = await app.recover()
    assert [h.execution_id for h in recovered] == ["f"]
    assert await handle.result(timeout=5) == 3
    assert ran == ["one", "two"]
    log = await app.storage.events.read("f")
    assert [e.sequence for e in log] == list(range(len(log)))
    assert EventKind.EXECUTION_RECOVERED in [e.kind for e in log]
    # The recovery took a newer token: everything after it is written under it.
    recovered_at = next(e for e in log if e.kind == EventKind.EXECUTION_RECOVERED)
    assert recovered_at.fence == 1
    assert log[-1].fence == 1
    assert await check_replay(app) == ["f"]


async def test_a_failing_step_is_retried_then_recorded_and_raised_into_the_body(
    app: Loom,
) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        raise ConnectionError("card network down")

    @app.workflow()
    async def pay(ctx: Context) -> str:
        try:
            await ctx.step(flaky, retry=Retry(attempts=3, initial_interval=0))
        except StepFailedError as exc:
            return f"gave up after {exc.attempts}: {exc.error_type}"
        return "paid"

    handle = await app.start(pay, id="p")
    assert await handle.result(timeout=5) == "gave up after 3: ConnectionError"
    assert len(attempts) == 3
    assert EventKind.STEP_FAILED in await kinds(app, "p")
    assert await check_replay(app) == ["p"]


async def test_a_step_failure_pickles_and_copies_with_what_it_names(app: Loom) -> None:
    """A StepFailedError caught in the body crosses a process (pickle) and is copied with
    its fields and message (it needs all five to be made, and was remade from its
    message alone: a TypeError)."""

    def declined() -> str:
        raise ConnectionError("card network down")

    caught: list[StepFailedError] = []

    @app.workflow()
    async def pay(ctx: Context) -> str:
        try:
            await ctx.step(
                declined, name="charge", retry=Retry(attempts=2, initial_interval=0)
            )
        except StepFailedError as exc:
            exc.add_note("while paying")
            caught.append(exc)
        return "gave up"

    assert await (await app.start(pay, id="p")).result(timeout=5) == "gave up"
    (live,) = caught
    for remade in (pickle.loads(pickle.dumps(live)), copy.copy(live), copy.deepcopy(live)):
        assert type(remade) is StepFailedError
        assert (remade.step, remade.position, remade.attempts) == ("charge", "0", 2)
        assert (remade.error_type, remade.error_message) == (
            "ConnectionError", "card network down"
        )
        assert str(remade) == str(live)
        assert remade.__notes__ == ["while paying"]


async def test_an_uncaught_failure_fails_the_execution(app: Loom) -> None:
    @app.workflow()
    async def broken(ctx: Context) -> None:
        raise ValueError("bad order")

    handle = await app.start(broken, id="b")
    with pytest.raises(WorkflowFailedError, match="ValueError: bad order"):
        await handle.result(timeout=5)
    assert await handle.status() == "failed"


async def test_a_start_onto_an_existing_id_is_refused_before_the_body_runs(app: Loom) -> None:
    ran: list[int] = []

    @app.workflow()
    async def once(ctx: Context) -> None:
        ran.append(1)

    await (await app.start(once, id="same")).result(timeout=5)
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.start(once, id="same")
    await app.drain()
    assert ran == [1]


async def test_sleep_parks_and_the_timer_service_resumes_it(app: Loom, clock: VirtualClock) -> None:
    @app.workflow()
    async def nap(ctx: Context) -> str:
        await ctx.sleep(30)
        return "awake"

    handle = await app.start(nap, id="n")
    await app.drain()
    assert await handle.status() == "suspended"
    (row,) = await app.storage.timers.pending("n")
    assert (row.wake_at - clock.now()).total_seconds() == 30
    await clock.advance(29)
    assert await handle.status() == "suspended"
    await clock.advance(1)
    assert await handle.result(timeout=5) == "awake"
    assert await app.storage.timers.pending("n") == ()


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="unset")


async def test_each_replay_starts_from_the_context_vars_the_execution_started_with(
    app: Loom,
) -> None:
    seen: list[str] = []

    async def note(value: str) -> str:
        return value

    @app.workflow()
    async def flow(ctx: Context) -> list[str]:
        seen.append(_REQUEST.get())
        _REQUEST.set("set by the body")
        # Two waits at once park the run (the run goes on in place from a lone due wait
        # only); it answers its own park (both waits, due, in one write) and replays.
        await ctx.gather(ctx.sleep(0), ctx.sleep(0))
        seen.append(_REQUEST.get())
        return [await ctx.step(note, "done")]

    _REQUEST.set("the starter's")
    handle = await app.start(flow, id="ctx-1")
    assert await handle.result(timeout=5) == ["done"]
    # Each replay after a park sees the starter's value again, not the first run's.
    assert seen == ["the starter's", "the starter's", "set by the body"]


async def test_a_replay_after_another_resume_starts_from_the_resumer_s_context(
    app: Loom, clock: VirtualClock
) -> None:
    seen: list[str] = []

    @app.workflow()
    async def flow(ctx: Context) -> list[str]:
        seen.append(_REQUEST.get())
        await ctx.sleep(30)
        seen.append(_REQUEST.get())
        await ctx.receive("go")
        seen.append(_REQUEST.get())
        return seen

    _REQUEST.set("the starter's")
    handle = await app.start(flow, id="ctx-2")
    await app.drain()
    # The timer service runs where the app was entered (the fixture's context, not this
    # test's); a send runs the resume from the sender's.
    await clock.advance(30)
    await app.drain()
    _REQUEST.set("the sender's")
    await app.send("ctx-2", "go")
    await handle.result(timeout=5)
    assert seen == [
        "the starter's",
        "unset", "unset",
        "the sender's", "the sender's", "the sender's",
    ]


async def test_a_lone_wait_already_due_goes_on_in_place(app: Loom) -> None:
    prefix: list[int] = []

    async def note(value: str) -> str:
        return value

    @app.workflow()
    async def flow(ctx: Context) -> list[str]:
        prefix.append(1)
        _REQUEST.set("set by the body")
        await ctx.sleep(0)  # parked and answered by the run itself; no replay
        return [await ctx.step(note, _REQUEST.get())]

    _REQUEST.set("the starter's")
    handle = await app.start(flow, id="in-place")
    assert await handle.result(timeout=5) == ["set by the body"]
    assert prefix == [1]  # the body ran once
    log = await app.storage.events.read("in-place")
    assert [(e.kind, e.fence) for e in log] == [
        ("EXECUTION_STARTED", 0),
        ("EXECUTION_SUSPENDED", 0),
        # Answered under the conditional fence: the run writes on under the new token.
        ("EXECUTION_RESUMED", 1),
        ("STEP_COMPLETED", 1),
        ("EXECUTION_COMPLETED", 1),
    ]
    assert await app.storage.timers.pending("in-place") == ()
    assert await check_replay(app) == ["in-place"]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("order#1", "form of the ids continue_as_new gives"),
        ("a#12", "form of the ids continue_as_new gives"),
        ("x" * (MAX_NEW_ID_BYTES + 1), f"at most {MAX_NEW_ID_BYTES} UTF-8 bytes"),
        ("é" * 241, f"at most {MAX_NEW_ID_BYTES} UTF-8 bytes"),
        ("a\x00", "control character"),
        ("\ud800", "lone surrogate"),
    ],
)
async def test_a_start_refuses_an_id_it_could_not_carry_through_before_writing(
    app: Loom, bad: str, says: str
) -> None:
    @app.workflow()
    async def noop(ctx: Context) -> None:
        return None

    with pytest.raises(InvalidInputError, match=says):
        await app.start(noop, id=bad)
    with pytest.raises(InvalidInputError, match=says):
        await app.execute(noop, id=bad)
    assert await app.storage.events.list_executions() == ()


async def test_a_successor_of_the_longest_id_can_receive_and_continue(app: Loom) -> None:
    # The ids derived from a new one (its inbox, its successors') fit in the store's limit.
    long_id = "x" * MAX_NEW_ID_BYTES

    @app.workflow()
    async def relay(ctx: Context, n: int) -> object:
        if n < 2:
            ctx.continue_as_new(n + 1)
        return await ctx.receive("go", timeout=60)

    handle = await app.start(relay, 0, id=long_id)
    await app.drain()
    await app.send(f"{long_id}#2", "go", {"ok": True})
    assert await handle.result(timeout=5) == {"ok": True}


@pytest.mark.parametrize("fine", ["order#1x", "a#", "#1-", "a#1.5", "x" * MAX_NEW_ID_BYTES])
async def test_ids_that_only_look_like_a_successors_are_taken(app: Loom, fine: str) -> None:
    @app.workflow()
    async def noop(ctx: Context) -> str:
        return ctx.execution_id

    assert await app.execute(noop, id=fine) == fine


async def test_a_step_result_that_is_not_json_is_recorded_as_the_steps_failure(
    app: Loom,
) -> None:
    runs: list[str] = []

    async def nul() -> str:
        runs.append("nul")
        return "a\x00b"

    async def raw() -> object:
        runs.append("raw")
        return b"bytes"

    @app.workflow()
    async def holds(ctx: Context) -> list[object]:
        seen: list[object] = []
        for fn in (nul, raw):
            try:
                await ctx.step(fn, retry=Retry(attempts=3, initial_interval=0))
            except StepFailedError as exc:
                seen.append([exc.error_type, exc.attempts, exc.__cause__, exc.__context__])
        return seen

    handle = await app.start(holds, id="h")
    refused = ["loom_runtime.errors.NotJsonError", 1, None, None]
    assert await handle.result(timeout=5) == [refused, refused]
    # Not retried (the step ran; running it again repeats its effects for the same
    # refusal), and recorded: a replay serves the failure without running the step.
    assert runs == ["nul", "raw"]
    log = await app.storage.events.read("h")
    assert [e.kind for e in log] == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_FAILED,
        EventKind.STEP_FAILED,
        EventKind.EXECUTION_COMPLETED,
    ]
    assert "contains U+0000" in str(log[1].payload["error"]["message"])  # type: ignore[index,call-overload]
    assert await check_replay(app) == ["h"]
    assert runs == ["nul", "raw"]


async def test_a_str_enum_is_recorded_as_its_value_wherever_the_body_meets_it(
    app: Loom, clock: VirtualClock
) -> None:
    class Status(str, enum.Enum):  # noqa: UP042  (the mixin: str() names the member)
        PAID = "paid"

    async def settle() -> Status:
        return Status.PAID

    seen: list[object] = []

    @app.workflow(name="settled")
    async def settled(ctx: Context, given: object) -> object:
        paid = await ctx.step(settle)
        note = await ctx.receive("note")
        seen.append([given, paid, note])
        return {Status.PAID: paid}

    handle = await app.start(settled, Status.PAID, id="s")
    await app.drain()
    await app.send("s", "note", [Status.PAID])
    # What json.dumps writes for the member, not str() of it ("Status.PAID"), and as a
    # plain str: live, on replay and to the caller alike.
    assert await handle.result(timeout=5) == {"paid": "paid"}
    assert repr(seen[-1]) == repr(["paid", "paid", ["paid"]])
    assert await check_replay(app) == ["s"]
    assert repr(seen[-1]) == repr(["paid", "paid", ["paid"]])


async def test_an_error_whose_str_is_a_str_enum_fails_its_step_alike_live_and_on_replay(
    app: Loom, clock: VirtualClock
) -> None:
    class Reason(str, enum.Enum):  # noqa: UP042  (the mixin: str() names the member)
        DECLINED = "declined"

    class CardError(Exception):
        def __str__(self) -> str:
            return Reason.DECLINED

    async def charge() -> None:
        raise CardError()

    seen: list[str] = []

    @app.workflow(name="charged")
    async def charged(ctx: Context) -> str:
        try:
            await ctx.step(charge)
        except StepFailedError as exc:
            seen.append(repr(exc.error_message))
            seen.append(str(exc))
        await ctx.sleep(5)
        return "done"

    await app.start(charged, id="c")
    await app.drain()
    assert await check_replay(app) == ["c"]
    live, replayed = seen[:2], seen[2:]
    assert live == replayed
    assert live[0] == "'declined'"


async def test_continue_as_new_refuses_arguments_that_are_not_json_in_the_body(
    app: Loom,
) -> None:
    @app.workflow()
    async def onward(ctx: Context) -> str:
        try:
            ctx.continue_as_new({1, 2})
        except InvalidInputError as exc:
            return type(exc).__name__
        return "continued"

    assert await app.execute(onward, id="o") == "NotJsonError"
    assert [e.kind for e in await app.storage.events.read("o")][-1] == (
        EventKind.EXECUTION_COMPLETED
    )


def _nested(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = {"a": value}
    return value


async def test_an_argument_nests_as_deep_as_a_steps_result_before_it_is_refused(
    app: Loom,
) -> None:
    async def deepest() -> object:
        return _nested(100)

    @app.workflow(name="deep")
    async def deep(ctx: Context, given: object, generation: int) -> object:
        if generation == 0:
            # A step's result, 100 levels deep, handed on to the successor as it came.
            ctx.continue_as_new(await ctx.step(deepest), 1)
        return given

    # The list that holds the arguments is the record's, not a level of the argument's.
    handle = await app.start(deep, _nested(100), 0, id="d")
    assert await handle.result(timeout=5) == _nested(100)
    assert len(await check_replay(app)) == 2  # the execution and its successor
    with pytest.raises(NotJsonError, match="more than 100 levels"):
        await app.start(deep, _nested(101), 0, id="too-deep")
    assert await app.storage.events.head("too-deep") == 0


async def test_more_recorded_values_than_one_append_takes_are_written_in_parts(
    app: Loom,
) -> None:
    @app.workflow()
    async def draws(ctx: Context) -> int:
        return len({ctx.uuid() for _ in range(MAX_EVENTS_PER_APPEND + 5)})

    handle = await app.start(draws, id="d")
    assert await handle.result(timeout=5) == MAX_EVENTS_PER_APPEND + 5
    log = await app.storage.events.read("d")
    assert len(log) == MAX_EVENTS_PER_APPEND + 7
    assert log[-1].kind == EventKind.EXECUTION_COMPLETED
    assert await check_replay(app) == ["d"]


async def test_a_workflow_registers_with_or_without_the_parentheses(app: Loom) -> None:
    @app.workflow
    async def bare(ctx: Context) -> str:
        return "bare"

    assert await app.execute(bare, id="b") == "bare"
    assert "test_a_workflow_registers_with_or_without_the_parentheses.<locals>.bare" in (
        app.workflows
    )
    with pytest.raises(InvalidInputError, match="a workflow name"):

        @app.workflow(name="nul\x00")
        async def nul(ctx: Context) -> None:
            return None


async def test_the_due_waits_of_a_park_are_answered_in_one_write() -> None:
    """A gather of sleeps ending at instants of their own parks once; the first answer
    takes every wait due by then (a resume per wait replayed and parked the run again
    each time, and a gather of a few hundred sleeps took minutes)."""
    async with wired() as w:

        @w.app.workflow()
        async def fan(ctx: Context, n: int) -> int:
            async def nap(i: int) -> int:
                await ctx.sleep(0.001 * (i + 1))
                return i

            return sum(await ctx.gather(*(nap(i) for i in range(n))))

        handle = await w.app.start(fan, 50, id="fan")
        await w.app.drain()
        await w.clock.advance(1)  # no timer service runs: every sleep is due now
        await w.app.timer_service.poll_once()
        assert await handle.result(timeout=5) == sum(range(50))
        kinds = [e.kind for e in await w.base.events.read("fan")]
        assert kinds.count(EventKind.EXECUTION_SUSPENDED) == 1
        assert kinds.count(EventKind.EXECUTION_RESUMED) == 50
        assert await check_replay(w.app, ["fan"]) == ["fan"]
        await w.app.timer_service.poll_once()  # the other rows: obsolete
        assert await w.base.timers.pending("fan") == ()


async def test_a_long_log_deleted_and_made_anew_is_read_anew_by_the_timer_service() -> None:
    """The timer service keeps the view of a long log and folds only what was appended
    since. A log deleted and written again under the same id, up to the same length,
    with a store clock too coarse to tell the two logs' events apart, is still read anew
    (its events carry newer tokens): the new execution is not resumed from the old one's
    view, input and all."""

    def coarse() -> datetime:  # a store clock that never moves
        return datetime(2030, 1, 1, tzinfo=UTC)

    storage = Storage(MemoryEventStore(clock=coarse), MemoryTimerStore(), MemoryLeaseStore())
    clock = VirtualClock()
    app = Loom(storage, node="n1", clock=clock)

    @app.workflow()
    async def fan(ctx: Context, n: int, tag: str) -> str:
        async def nap(i: int) -> int:
            await ctx.sleep(1 if i == 0 else 2)
            return i

        await ctx.gather(*(nap(i) for i in range(n)))
        return tag

    async with app:
        await app.start(fan, 70, "old", id="job")
        await app.drain()
        assert (await app._look("job")).input == [70, "old"]  # kept: 70 waits
        await app.cancel("job")
        assert await storage.events.delete_execution("job")
        handle = await app.start(fan, 70, "new", id="job")
        await app.drain()
        # The same sequence, kind, payload and instant as the event the kept view was
        # folded to; only its token tells the new log from the old.
        assert (await app._look("job")).input == [70, "new"]
        await clock.advance(2)
        assert await handle.result(timeout=5) == "new"


async def test_the_view_of_a_long_log_is_not_kept_once_its_execution_ended() -> None:
    """The timer service keeps the view of a long log it woke, every step's result in
    it, so that its next wake folds only what was appended. An execution that then ended
    (completed after the wake, cancelled while parked) has no next wake: its view went
    only when 1024 later ones had pushed it out, so a worker running long executions held
    the last 1024 of them, finished, for good (each step's result with them)."""
    clock = VirtualClock()
    app = Loom("memory://", node="n1", clock=clock)

    async def result(i: int) -> str:
        return f"result {i}"

    @app.workflow()
    async def long(ctx: Context) -> int:
        for i in range(70):
            await ctx.step(result, i)
        await ctx.sleep(1)
        await ctx.sleep(1)
        return 70

    def views_of(ids: list[str]) -> list[View]:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, View) and o.execution_id in ids]

    ids = [f"long-{i}" for i in range(6)]
    async with app:
        for execution_id in ids:
            await app.start(long, id=execution_id)
        await app.drain()
        await clock.advance(1)  # each woken from its first sleep: parked on the second
        await app.drain()
        for execution_id in ids[3:]:
            assert await app.cancel(execution_id)
        await clock.advance(1)
        for execution_id in ids[:3]:
            assert await app.get(execution_id).result(timeout=5) == 70
        await app.drain()
        assert views_of(ids) == []


async def test_what_a_caller_does_to_a_view_it_read_never_reaches_a_run() -> None:
    """A step result read from ``app.inspect`` and changed by its caller is not what a
    later resume replays, nor what a later ``result()`` returns."""
    async with open_storage("memory://") as storage:
        clock = VirtualClock()
        app = Loom(storage, node="n1", clock=clock)

        async def price() -> dict[str, int]:
            return {"amount": 10}

        @app.workflow()
        async def order(ctx: Context) -> dict[str, int]:
            quote = await ctx.step(price)
            await ctx.gather(*(ctx.sleep(1 if i == 0 else 2) for i in range(70)))
            return quote

        async with app:
            handle = await app.start(order, id="o")
            await app.drain()
            await clock.advance(1)
            view = await app.inspect("o")
            view.records[(0,)].value["amount"] = 999_999  # type: ignore[index,call-overload]
            await clock.advance(1)
            result = await handle.result(timeout=5)
            assert result == {"amount": 10}
            result["amount"] = 0
            assert await handle.result(timeout=5) == {"amount": 10}


class _OffsetClock:
    """A clock that gives aware datetimes at +02:00, and never moves."""

    def now(self) -> datetime:
        return datetime(2030, 6, 1, 11, 30, tzinfo=timezone(timedelta(hours=2)))

    async def sleep(self, seconds: float) -> None:
        return None


async def test_ctx_now_is_utc_whatever_offset_the_apps_clock_gives() -> None:
    """``ctx.now()`` gives the current time in UTC, as it says and as every instant the
    runtime records is written (a deadline, a wake): a clock at +02:00 is read in UTC, and
    the log records the UTC instant (it recorded, and gave the body, the clock's offset)."""
    app = Loom("memory://", node="n", clock=_OffsetClock(), timers=False)

    @app.workflow(name="stamp")
    async def stamp(ctx: Context) -> str:
        now = ctx.now()
        assert now.utcoffset() == timedelta(0)
        return now.isoformat()

    async with app:
        assert await app.execute(stamp, id="s") == "2030-06-01T09:30:00+00:00"
        recorded = [
            e.payload["result"]  # type: ignore[index,call-overload]
            for e in await app.storage.events.read("s")
            if e.kind == EventKind.STEP_COMPLETED
        ]
        assert recorded == ["2030-06-01T09:30:00+00:00"]
        assert await check_replay(app, ["s"]) == ["s"]
