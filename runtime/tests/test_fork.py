"""``app.fork``: a new execution served a prefix of another's recorded calls, running the
rest with the current code; the execution forked from is left as it was."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from loom_runtime import (
    ActionDeniedError,
    Context,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    InvalidInputError,
    Loom,
    ReplayDivergedError,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from loom_runtime.testing import VirtualClock, check_replay, crash_at

from loom_core import Event, EventKind


class Steps:
    """Steps that count their runs; ``broken`` names the ones that raise."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.broken: set[str] = set()

    def __call__(self, label: str) -> str:
        self.ran.append(label)
        if label in self.broken:
            raise RuntimeError(f"{label} is broken")
        return label.upper()


async def log(app: Loom, execution_id: str) -> list[Event]:
    return list(await app.storage.events.read(execution_id))


async def test_a_fork_is_served_the_calls_before_at_and_runs_the_rest(app: Loom) -> None:
    steps = Steps()
    steps.broken.add("c")

    @app.workflow()
    async def flow(ctx: Context, order: str) -> list[object]:
        return [
            await ctx.step(steps, "a"),
            str(ctx.uuid()),
            await ctx.step(steps, "b"),
            await ctx.step(steps, "c"),
            order,
        ]

    with pytest.raises(WorkflowFailedError):
        await (await app.start(flow, "o-1", id="src")).result(timeout=5)
    before = await log(app, "src")
    drawn = (await app.inspect("src")).records[(1,)].value
    assert steps.ran == ["a", "b", "c"]

    steps.broken.clear()  # the bug is fixed
    steps.ran.clear()
    fork = await app.fork("src", at=3, id="fixed")
    assert await fork.result(timeout=5) == ["A", drawn, "B", "C", "o-1"]
    assert steps.ran == ["c"]  # a and b were served from the copied records
    assert await log(app, "src") == before  # the original is not touched

    view = await app.inspect("fixed")
    assert (view.forked_from, view.forked_at) == ("src", 3)
    assert view.workflow == (await app.inspect("src")).workflow
    assert view.input == ["o-1"]
    started = (await log(app, "fixed"))[0]
    assert isinstance(started.payload, dict)
    assert started.payload["forked_from"] == {"execution": "src", "at": 3}
    assert await check_replay(app, ["fixed"]) == ["fixed"]


async def test_at_zero_runs_everything_again_with_the_same_input(app: Loom) -> None:
    steps = Steps()

    @app.workflow()
    async def flow(ctx: Context, label: str) -> str:
        return await ctx.step(steps, label)

    assert await app.execute(flow, "x", id="src") == "X"
    fork = await app.fork("src", at=0)
    assert await fork.result(timeout=5) == "X"
    assert steps.ran == ["x", "x"]
    assert fork.execution_id != "src"
    assert [e.kind for e in await log(app, fork.execution_id)] == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_COMPLETED,
    ]


async def test_without_at_every_recorded_call_is_taken_failed_steps_too(app: Loom) -> None:
    steps = Steps()
    steps.broken.add("b")
    handled = False

    @app.workflow()
    async def flow(ctx: Context) -> str:
        await ctx.step(steps, "a")
        try:
            await ctx.step(steps, "b")
        except Exception:
            if handled:
                return "handled"
            raise
        return "done"

    with pytest.raises(WorkflowFailedError):
        await (await app.start(flow, id="src")).result(timeout=5)
    handled = True  # the body's bug is fixed; the step's failure stands
    steps.ran.clear()
    fork = await app.fork("src")
    assert await fork.result(timeout=5) == "handled"
    assert steps.ran == []  # the failed step is served its recorded failure
    assert (await app.inspect(fork.execution_id)).forked_at == 2


async def test_sleeps_receives_and_gathers_are_served_without_waiting(
    app: Loom, clock: VirtualClock
) -> None:
    steps = Steps()

    @app.workflow()
    async def flow(ctx: Context) -> list[object]:
        await ctx.sleep(3600)
        approved = await ctx.receive("approve")
        first = await ctx.receive_any("ship", "hold")
        nothing = await ctx.receive("never", timeout=60)
        pair = await ctx.gather(ctx.step(steps, "g1"), ctx.step(steps, "g2"))
        last = await ctx.step(steps, "last")
        return [approved, list(first) if first else None, nothing, list(pair), last]

    handle = await app.start(flow, id="src")
    await clock.advance(3600)
    await app.send("src", "approve", {"by": "ann"})
    await app.send("src", "hold", 7)
    await clock.advance(60)
    expected = [{"by": "ann"}, ["hold", 7], None, ["G1", "G2"], "LAST"]
    assert await handle.result(timeout=5) == expected
    records = (await app.inspect("src")).records
    assert (records[(3,)].call, records[(3,)].value) == ("receive", None)  # timed out

    steps.ran.clear()
    fork = await app.fork("src", at=7)
    assert await fork.result(timeout=5) == expected  # no advance, no message needed
    assert steps.ran == ["last"]
    copied = (await app.inspect(fork.execution_id)).records
    taken = copied[(2,)]
    assert (taken.call, taken.name, taken.value, taken.topics) == (
        "receive_any", "hold", 7, ("ship", "hold")
    )
    assert list(await app.storage.timers.pending(fork.execution_id)) == []

    steps.ran.clear()
    partial = await app.fork("src", at=5)  # the gather's first branch only
    assert await partial.result(timeout=5) == expected
    assert steps.ran == ["g2", "last"]


async def test_a_fork_receives_from_its_own_inbox_only(app: Loom, clock: VirtualClock) -> None:
    @app.workflow()
    async def flow(ctx: Context) -> object:
        return await ctx.receive("go")

    await app.start(flow, id="src")
    await clock.advance(0)
    fork = await app.fork("src", at=0, id="copy")
    await app.send("src", "go", "for the original")
    await clock.advance(0)
    assert await fork.status() == "suspended"
    await app.send("copy", "go", "for the fork")
    assert await fork.result(timeout=5) == "for the fork"
    assert await app.get("src").result(timeout=5) == "for the original"


async def test_a_parked_execution_forked_is_still_resumed(app: Loom, clock: VirtualClock) -> None:
    steps = Steps()

    @app.workflow()
    async def flow(ctx: Context) -> str:
        await ctx.step(steps, "a")
        await ctx.sleep(60)
        return await ctx.step(steps, "b")

    original = await app.start(flow, id="src")
    await clock.advance(0)
    assert await original.status() == "suspended"
    fork = await app.fork("src", id="copy")
    await clock.advance(0)
    assert await fork.status() == "suspended"  # it waits out a sleep of its own
    await clock.advance(60)
    assert await original.result(timeout=5) == "B"
    assert await fork.result(timeout=5) == "B"
    assert steps.ran == ["a", "b", "b"]


async def test_a_fork_that_dies_is_recovered_with_its_copied_calls(app: Loom) -> None:
    steps = Steps()

    @app.workflow()
    async def flow(ctx: Context) -> list[str]:
        return [await ctx.step(steps, label) for label in ("a", "b", "c")]

    assert await app.execute(flow, id="src") == ["A", "B", "C"]
    steps.ran.clear()
    point = crash_at(app, position=2, when="before", execution_id="copy")
    await app.fork("src", at=1, id="copy")
    await asyncio.wait_for(point.fired.wait(), 5)
    assert steps.ran == ["b"]
    await app.recover()
    assert await app.get("copy").result(timeout=5) == ["A", "B", "C"]
    assert steps.ran == ["b", "c"]
    assert await check_replay(app, ["copy"]) == ["copy"]


async def test_a_fork_whose_code_no_longer_makes_a_copied_call_diverges(app: Loom) -> None:
    steps = Steps()
    renamed = False

    def other(label: str) -> str:
        return label

    @app.workflow()
    async def flow(ctx: Context) -> str:
        if renamed:
            await ctx.step(other, "a")
        else:
            await ctx.step(steps, "a")
        return await ctx.step(steps, "b")

    await app.execute(flow, id="src")
    renamed = True
    fork = await app.fork("src", at=1, id="copy")
    await asyncio.sleep(0.05)
    assert await fork.status() == "running"  # stopped for an operator, as any divergence
    reported = app.reported  # type: ignore[attr-defined]
    assert any(isinstance(e, ReplayDivergedError) for e in reported)


async def test_a_fork_gets_a_deadline_of_its_own_only_when_asked(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def flow(ctx: Context) -> None:
        await ctx.sleep(3600)

    await app.start(flow, id="src", execution_timeout=60)
    await clock.advance(0)
    plain = await app.fork("src")
    timed = await app.fork("src", execution_timeout=timedelta(minutes=5))
    assert (await app.inspect(plain.execution_id)).deadline is None
    assert (await app.inspect(timed.execution_id)).deadline == clock.now() + timedelta(
        minutes=5
    )


@pytest.mark.parametrize("at", [-1, True, 1.5, "2"])
async def test_a_bad_at_is_refused_and_nothing_is_written(app: Loom, at: object) -> None:
    @app.workflow()
    async def flow(ctx: Context) -> int:
        return 1

    await app.execute(flow, id="src")
    with pytest.raises(InvalidInputError, match="at="):
        await app.fork("src", at=at, id="copy")  # type: ignore[arg-type]
    assert (await app.inspect("copy")).status is None


async def test_refusals_before_anything_is_written(app: Loom) -> None:
    @app.workflow(name="flow")
    async def flow(ctx: Context, a: int) -> int:
        return a

    await app.execute(flow, 1, id="src")
    await app.execute(flow, 2, id="taken")
    taken = await log(app, "taken")

    with pytest.raises(ExecutionNotFoundError):
        await app.fork("nowhere", id="copy")
    with pytest.raises(ExecutionAlreadyExistsError):
        await app.fork("src", id="taken")
    assert await log(app, "taken") == taken
    with pytest.raises(InvalidInputError):
        await app.fork("src", id="copy", if_exists="attach-please")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        await app.fork("src", if_exists="attach")  # attach needs an id

    other = Loom(app.storage, node="other")  # runs no workflow named flow
    async with other:
        with pytest.raises(WorkflowNotFoundError, match="flow"):
            await other.fork("src", id="copy")

        @other.workflow(name="flow")
        async def changed(ctx: Context) -> int:  # no longer takes the argument
            return 0

        with pytest.raises(InvalidInputError, match="takes 0 arguments"):
            await other.fork("src", id="copy")
    assert (await app.inspect("copy")).status is None


async def test_if_exists_attach_gives_the_same_fork_made_before_and_nothing_else(
    app: Loom,
) -> None:
    steps = Steps()

    @app.workflow()
    async def flow(ctx: Context, label: str) -> str:
        return await ctx.step(steps, label)

    await app.execute(flow, "a", id="src")
    first = await app.fork("src", at=0, id="copy", if_exists="attach")
    assert await first.result(timeout=5) == "A"
    again = await app.fork("src", at=0, id="copy", if_exists="attach")
    assert again.execution_id == "copy"
    assert await again.result(timeout=5) == "A"
    assert steps.ran == ["a", "a"]  # the original's and the one fork's

    await app.execute(flow, "b", id="unrelated")
    for taken_id, at in (("copy", 1), ("src", 0), ("unrelated", 0)):
        # Another fork's position, the original itself, an execution that is no fork.
        with pytest.raises(ExecutionAlreadyExistsError) as refused:
            await app.fork("src", at=at, id=taken_id, if_exists="attach")
        assert "not a fork of 'src'" in str(refused.value)
    assert steps.ran == ["a", "a", "b"]


async def test_a_retried_fork_of_every_call_attaches_after_a_running_original_went_on(
    app: Loom, clock: VirtualClock
) -> None:
    """A fork without at= of an execution still running, retried with
    if_exists='attach' after the original recorded more calls, gets the fork the first
    call made (it was refused: the fork took fewer calls than the original now holds),
    and another execution's fork at that id is still refused."""

    @app.workflow()
    async def flow(ctx: Context) -> object:
        await ctx.step(lambda: 1, name="a")
        await ctx.sleep(10)
        await ctx.step(lambda: 2, name="b")
        return await ctx.receive("go")

    await app.start(flow, id="src")
    await clock.advance(0)
    first = await app.fork("src", id="copy", if_exists="attach")
    await clock.advance(10)  # the original records its sleep and step b
    again = await app.fork("src", id="copy", if_exists="attach")
    assert again.execution_id == first.execution_id == "copy"
    view = await app.inspect("copy")
    assert (view.forked_from, view.forked_at) == ("src", 1)
    await app.start(flow, id="other")
    with pytest.raises(ExecutionAlreadyExistsError, match="not a fork of 'other'"):
        await app.fork("other", id="copy", if_exists="attach")


async def test_a_retried_fork_at_a_position_past_the_end_attaches_after_the_original_went_on(
    app: Loom, clock: VirtualClock
) -> None:
    """A fork at an at= past what a running original had recorded is kept as where its
    calls ended; retried with if_exists='attach' once the original recorded more, it gets
    the fork the first call made (it was refused: 'not a fork at' the new end), and a
    call asking another at= is still refused."""

    @app.workflow()
    async def flow(ctx: Context) -> object:
        await ctx.step(lambda: 1, name="a")
        await ctx.sleep(10)
        await ctx.step(lambda: 2, name="b")
        return await ctx.receive("go")

    await app.start(flow, id="src")
    await clock.advance(0)
    first = await app.fork("src", at=50, id="copy", if_exists="attach")
    await clock.advance(10)  # the original records its sleep and step b
    again = await app.fork("src", at=50, id="copy", if_exists="attach")
    assert again.execution_id == first.execution_id == "copy"
    view = await app.inspect("copy")
    assert (view.forked_from, view.forked_at) == ("src", 1)
    at_one = await app.fork("src", at=1, id="copy", if_exists="attach")  # where it is
    assert at_one.execution_id == "copy"
    with pytest.raises(ExecutionAlreadyExistsError, match="not a fork of 'src' at 2"):
        await app.fork("src", at=2, id="copy", if_exists="attach")
    assert [e.kind for e in await log(app, "copy")].count(EventKind.EXECUTION_STARTED) == 1


async def test_authorize_decides_on_the_execution_forked_from() -> None:
    asked: list[tuple[object, str, str]] = []

    def authorize(principal: object, action: str, execution_id: str) -> bool:
        asked.append((principal, action, execution_id))
        return principal == "ops"

    app = Loom("memory://", authorize=authorize)

    @app.workflow()
    async def flow(ctx: Context) -> int:
        return 1

    async with app:
        await app.execute(flow, id="src")
        before = await log(app, "src")
        with pytest.raises(ActionDeniedError):
            await app.fork("src", id="copy", principal="intern")
        assert (await app.inspect("copy")).status is None
        assert await log(app, "src") == before  # a refusal does not write to the original
        # Asked before the log is read: a refused caller learns nothing of what is there.
        with pytest.raises(ActionDeniedError):
            await app.fork("nowhere", id="copy", principal="intern")
        fork = await app.fork("src", id="copy", principal="ops")
        assert await fork.result(timeout=5) == 1
    assert asked == [
        ("intern", "fork", "src"), ("intern", "fork", "nowhere"), ("ops", "fork", "src")
    ]


async def test_an_at_past_the_recorded_calls_is_kept_as_where_they_end(app: Loom) -> None:
    @app.workflow()
    async def flow(ctx: Context) -> str:
        return str(ctx.uuid())

    drawn = await app.execute(flow, id="src")
    for at in (5, 10**5000):
        fork = await app.fork("src", at=at)
        assert await fork.result(timeout=5) == drawn
        assert (await app.inspect(fork.execution_id)).forked_at == 1


async def test_a_fork_that_would_not_fit_one_append_is_refused(app: Loom) -> None:
    @app.workflow()
    async def long(ctx: Context) -> int:
        for _ in range(10_000):
            ctx.uuid()
        return 0

    await app.execute(long, id="src")
    with pytest.raises(InvalidInputError, match="would copy 10000 recorded calls"):
        await app.fork("src", id="copy")
    assert (await app.inspect("copy")).status is None
    fork = await app.fork("src", at=9_999, id="copy")
    assert await fork.result(timeout=30) == 0
    assert len(await log(app, "copy")) == 10_000 + 2  # the last uuid, drawn again


async def test_a_wait_the_original_was_still_in_runs_anew_counted_from_the_fork(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def waits(ctx: Context) -> object:
        await ctx.sleep(100)
        return await ctx.receive("answer", timeout=100)

    await app.start(waits, id="src")
    await clock.advance(50)  # half its sleep gone
    await app.cancel("src")
    fork = await app.fork("src", id="copy")
    await clock.advance(99)
    assert (await app.inspect("copy")).records == {}  # its sleep is 100 s of its own
    await clock.advance(1)
    assert [r.call for r in (await app.inspect("copy")).records.values()] == ["sleep"]
    await clock.advance(99)
    assert await fork.status() == "suspended"  # so is the receive's timeout
    await clock.advance(1)
    assert await fork.result(timeout=5) is None
    assert await check_replay(app) == ["copy", "src"]


async def test_a_fork_on_sqlite_is_carried_on_after_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    steps = Steps()
    steps.broken.add("ship")
    holding = {"on": False}
    began = asyncio.Event()
    never = asyncio.Event()  # the first process leaves with the fork mid-step

    async def ship(label: str) -> str:
        if holding["on"]:
            steps.ran.append(label)
            began.set()
            await never.wait()
        return steps(label)

    def app() -> Loom:
        loom = Loom(url, node="n")

        @loom.workflow(name="fulfil")
        async def fulfil(ctx: Context) -> list[str]:
            charged = await ctx.step(steps, "charge")
            await ctx.set_event("stage", "charged")
            shipped = await ctx.step(ship, "ship")
            return [charged, shipped]

        return loom

    async with app() as first:
        with pytest.raises(WorkflowFailedError):
            await first.execute("fulfil", id="src")
        steps.broken.clear()  # the fix is deployed
        holding["on"] = True
        await first.fork("src", at=2, id="again")
        await began.wait()
    holding["on"] = False
    async with app() as again:  # the same node starts again
        assert await again.get("again").result(timeout=10) == ["CHARGE", "SHIP"]
        assert await again.get_event("again", "stage") == "charged"
        assert await again.get("src").status() == "failed"
        assert await check_replay(again) == ["again", "src"]
    assert steps.ran == ["charge", "ship", "ship", "ship"]  # charged once
