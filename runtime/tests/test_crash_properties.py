"""Workflows of every shape, killed at any durable call, finish exactly once.

Hypothesis draws a workflow (steps, failing steps, sleeps, receives whose message comes
before the receive, while it waits, or never, gathers of steps and sleeps, recorded
random values passed on to a step) and a plan of crashes (before or after any step, before
a park). A driver plays the world: it sends the messages, moves the virtual clock to the
next wake and, after each crash, recovers as a restarted process would. When the
execution ends:

- every step ran exactly once (a crash point fires only where the step's record is
  durable or its effect has not happened), a failing one once per attempt;
- the result is what the workflow computes, the values it drew included;
- every message was consumed exactly once, sent once or twice under one key;
- the log is gapless, starts once, ends once with its last event, records each call
  once and each recovery once per crash;
- the log replays against the code without divergence.

Everything runs on one event loop over ``memory://`` with a virtual clock, seeded random
and async steps only, so an example runs the same way every time, and ``derandomize``
makes the examples themselves the same on every run.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections import Counter, deque
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeAlias

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from loom_runtime import Context, Durable, Loom, Retry, StepFailedError
from loom_runtime.testing import CrashAt, VirtualClock, check_replay, crash_at

from loom_core import Event, EventKind, JsonValue

Op: TypeAlias = list[Any]
"""One operation of a drawn workflow, as JSON (it is the workflow's input):
``["step", k]``, ``["fail", k]``, ``["sleep", seconds]``, ``["recv", k, arrival,
timeout, topic]`` (its message is ``{"m": k}``), ``["gather", [ops]]``, ``["draw", kind,
k]`` (a recorded value, then a step ``k`` that returns what it is given; the body keeps
both)."""

Arrival: TypeAlias = Literal["early", "late", "never"]
EXECUTION = "x"
ATTEMPTS = 2
ROUNDS = 200
POLL = 1.0

# -- the drawn workflow --------------------------------------------------------------------


@st.composite
def workflows(draw: st.DrawFn) -> list[Op]:
    numbers = iter(range(1000))
    ops: list[Op] = []
    for _ in range(draw(st.integers(min_value=1, max_value=7))):
        kind = draw(st.sampled_from(["step", "fail", "sleep", "recv", "recv", "gather", "draw"]))
        if kind == "step" or kind == "fail":
            ops.append([kind, next(numbers)])
        elif kind == "sleep":
            ops.append(["sleep", draw(st.sampled_from([0, 0, 5, 30]))])
        elif kind == "recv":
            arrival: Arrival = draw(st.sampled_from(["early", "late", "never"]))
            topic = f"t{draw(st.integers(min_value=0, max_value=1))}"
            timeout = draw(st.sampled_from([None, 60]))
            ops.append(["recv", next(numbers), arrival, timeout, topic])
        elif kind == "gather":
            branches: list[Op] = []
            kinds = st.lists(st.sampled_from(["step", "sleep"]), min_size=1, max_size=3)
            for branch in draw(kinds):
                if branch == "step":
                    branches.append(["step", next(numbers)])
                else:
                    branches.append(["sleep", draw(st.sampled_from([0, 10]))])
            ops.append(["gather", branches])
        else:
            ops.append(["draw", draw(st.sampled_from(["uuid", "random", "now"])), next(numbers)])
    # A receive that will get no message waits for its timeout: give it one.
    for op, value in zip(ops, messages(ops)[0], strict=True):
        if op[0] == "recv" and value is None:
            op[3] = 60
    return ops


def messages(ops: Sequence[Op]) -> tuple[list[JsonValue], list[tuple[str, JsonValue]]]:
    """What each op's receive gets (None for other ops), and every message consumed, in
    order. The early messages are all sent at the start, in the order of their receives;
    a late one when its receive waits. Each topic is first in, first out."""
    queues: dict[str, deque[JsonValue]] = {}
    for op in ops:
        if op[0] == "recv" and op[2] == "early":
            queues.setdefault(op[4], deque()).append({"m": op[1]})
    got: list[JsonValue] = []
    consumed: list[tuple[str, JsonValue]] = []
    for op in ops:
        value: JsonValue = None
        if op[0] == "recv":
            queue = queues.get(op[4])
            if queue:
                value = queue.popleft()
            elif op[2] == "late":
                value = {"m": op[1]}
            if value is not None:
                consumed.append((op[4], value))
        got.append(value)
    return got, consumed


def positions(ops: Sequence[Op]) -> dict[tuple[int, ...], Op]:
    """Each receive by the position its call takes: one per call, two for a draw (the
    value and its step), and a gather's own after its branches'."""
    found: dict[tuple[int, ...], Op] = {}
    counter = 0
    for op in ops:
        if op[0] == "recv":
            found[(counter,)] = op
        if op[0] == "gather":
            counter += len(op[1]) + 1
        else:
            counter += 2 if op[0] == "draw" else 1
    return found


def step_numbers(ops: Sequence[Op]) -> list[int]:
    """Every step the workflow makes, by number (failing ones included)."""
    numbers: list[int] = []
    for op in ops:
        if op[0] in ("step", "fail"):
            numbers.append(op[1])
        elif op[0] == "draw":
            numbers.append(op[2])
        elif op[0] == "gather":
            numbers.extend(branch[1] for branch in op[1] if branch[0] == "step")
    return numbers


def failing(ops: Sequence[Op]) -> set[int]:
    return {op[1] for op in ops if op[0] == "fail"}


def parks(ops: Sequence[Op]) -> bool:
    return any(
        op[0] in ("sleep", "recv")
        or (op[0] == "gather" and any(b[0] == "sleep" for b in op[1]))
        for op in ops
    )


Crash: TypeAlias = tuple[str, Literal["before", "after"]]


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[Op], list[Crash]]:
    ops = draw(workflows())
    targets: list[str] = [f"s{k}" for k in step_numbers(ops)]
    if parks(ops):
        targets.append("park")
    crashes: list[Crash] = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        target = draw(st.sampled_from(targets))
        when: Literal["before", "after"] = (
            "before" if target == "park" else draw(st.sampled_from(["before", "after"]))
        )
        crashes.append((target, when))
    return ops, crashes


def expected(ops: Sequence[Op]) -> list[JsonValue]:
    """The workflow's result, with each drawn value as None (the log decides it)."""
    out: list[JsonValue] = []
    for op, received in zip(ops, messages(ops)[0], strict=True):
        match op[0]:
            case "step":
                out.append(f"v{op[1]}")
            case "fail":
                out.append(f"failed:{op[1]}")
            case "sleep":
                out.append("slept")
            case "recv":
                out.append(received)
            case "gather":
                out.append([f"v{b[1]}" if b[0] == "step" else None for b in op[1]])
            case "draw":
                out.append(None)
    return out


# -- the workflow and the world around it --------------------------------------------------


class World:
    """The effects outside Loom: each step's calls, with their arguments."""

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()
        self.echoed: dict[int, list[JsonValue]] = {}

    async def step(self, k: int) -> str:
        self.calls[k] += 1
        return f"v{k}"

    async def fail(self, k: int) -> str:
        self.calls[k] += 1
        raise RuntimeError(f"step {k} always fails")

    async def echo(self, k: int, value: JsonValue) -> JsonValue:
        self.calls[k] += 1
        self.echoed.setdefault(k, []).append(value)
        return value


def register(app: Loom, world: World) -> None:
    """Register the workflow that plays a drawn list of ops, as ``drawn``."""

    def branch(ctx: Context, op: Op) -> Durable[Any]:
        if op[0] == "step":
            return ctx.step(world.step, op[1], name=f"s{op[1]}")
        return ctx.sleep(op[1])

    @app.workflow(name="drawn")
    async def drawn(ctx: Context, ops: list[Op]) -> list[JsonValue]:
        out: list[JsonValue] = []
        for op in ops:
            match op[0]:
                case "step":
                    out.append(await ctx.step(world.step, op[1], name=f"s{op[1]}"))
                case "fail":
                    retry = Retry(attempts=ATTEMPTS, initial_interval=0)
                    try:
                        await ctx.step(world.fail, op[1], name=f"s{op[1]}", retry=retry)
                    except StepFailedError:
                        out.append(f"failed:{op[1]}")
                case "sleep":
                    await ctx.sleep(op[1])
                    out.append("slept")
                case "recv":
                    out.append(await ctx.receive(op[4], timeout=op[3]))
                case "gather":
                    out.append(list(await ctx.gather(*(branch(ctx, b) for b in op[1]))))
                case "draw":
                    value: JsonValue
                    if op[1] == "uuid":
                        value = str(ctx.uuid())
                    elif op[1] == "random":
                        value = ctx.random()
                    else:
                        value = ctx.now().isoformat()
                    echoed = await ctx.step(world.echo, op[2], value, name=f"s{op[2]}")
                    out.append([value, echoed])
        return out


async def play(app: Loom, clock: VirtualClock, ops: list[Op], points: list[CrashAt]) -> int:
    """Start the workflow and play the world until it ends; returns the crashes that
    fired."""
    receives = positions(ops)
    sent: set[int] = set()

    async def send(op: Op) -> None:
        # Twice under one key for even k: the second send must change nothing.
        for _ in range(2 if op[1] % 2 == 0 else 1):
            await app.send(EXECUTION, op[4], {"m": op[1]}, key=f"m{op[1]}")
        sent.add(op[1])

    await app.start("drawn", ops, id=EXECUTION)
    for op in ops:
        if op[0] == "recv" and op[2] == "early":
            await send(op)
    for _ in range(ROUNDS):
        await app.drain()
        view = await app.inspect(EXECUTION)
        if view.terminal:
            return sum(point.count for point in points)
        if view.status == "running":
            # Its run died at a crash point: what a restarted process does.
            await app.recover()
            continue
        waits = view.pending_waits()
        late = [
            receives[w.position]
            for w in waits
            if w.call == "receive"
            and receives[w.position][2] == "late"
            and receives[w.position][1] not in sent
        ]
        if late:
            for op in late:
                await send(op)
            continue
        wakes = [w.wake_at for w in waits if w.wake_at is not None]
        assert wakes, f"parked with nothing that can wake it: {waits}"
        seconds = (min(wakes) - clock.now()).total_seconds()
        # At least one poll of the timer service, which may not have run since the wake
        # came due.
        await clock.advance(max(seconds, POLL))
    raise AssertionError(f"not finished after {ROUNDS} rounds: {await app.inspect(EXECUTION)}")


# -- the checks ----------------------------------------------------------------------------


def check_log(log: Sequence[Event], ops: Sequence[Op], crashes: int) -> None:
    kinds = [e.kind for e in log]
    assert [e.sequence for e in log] == list(range(len(log)))
    assert kinds.count(EventKind.EXECUTION_STARTED) == 1
    assert kinds[0] == EventKind.EXECUTION_STARTED
    terminal = [
        k
        for k in kinds
        if k
        in (
            EventKind.EXECUTION_COMPLETED,
            EventKind.EXECUTION_FAILED,
            EventKind.EXECUTION_CANCELLED,
            EventKind.EXECUTION_CONTINUED,
        )
    ]
    assert terminal == [EventKind.EXECUTION_COMPLETED]
    assert kinds[-1] == terminal[0]
    recorded = [
        tuple(e.payload["position"])  # type: ignore[index,arg-type,call-overload]
        for e in log
        if e.kind in (EventKind.STEP_COMPLETED, EventKind.STEP_FAILED)
    ]
    assert len(recorded) == len(set(recorded)), f"a call recorded twice: {recorded}"
    delivered = [
        (e.payload["topic"], e.payload["value"])  # type: ignore[index,call-overload]
        for e in log
        if e.kind == EventKind.MESSAGE_CONSUMED
    ]
    assert delivered == messages(ops)[1]
    assert kinds.count(EventKind.EXECUTION_RECOVERED) == crashes


def check_wakes(log: Sequence[Event], written_at: dict[int, datetime]) -> None:
    """No timer or timeout was answered before its wake time (by the virtual clock when
    the answer was written)."""
    for resumed in log:
        if resumed.kind != EventKind.EXECUTION_RESUMED:
            continue
        payload = resumed.payload
        assert isinstance(payload, dict)
        assert isinstance(payload["answer"], dict)
        if payload["answer"]["kind"] not in ("timer", "timeout"):
            continue
        park = log[payload["park"]]  # type: ignore[index]
        assert park.kind == EventKind.EXECUTION_SUSPENDED
        (wait,) = [
            w
            for w in park.payload["waits"]  # type: ignore[index,call-overload,union-attr]
            if w["position"] == payload["position"]  # type: ignore[index,call-overload]
        ]
        wake_at = datetime.fromisoformat(wait["wake_at"])  # type: ignore[index,call-overload,arg-type]
        assert written_at[resumed.sequence] >= wake_at, (resumed, wait)


async def run_plan(ops: list[Op], crashes: list[Crash], url: str = "memory://") -> tuple[int, int]:
    """Play one plan and check it; returns the crashes that fired and the parks written."""
    clock = VirtualClock()
    errors: list[BaseException] = []
    written_at: dict[int, datetime] = {}

    def durable(event: Event) -> None:
        if event.execution_id == EXECUTION:
            written_at[event.sequence] = clock.now()

    app = Loom(
        url,
        node="n1",
        clock=clock,
        random=random.Random(7),
        on_error=errors.append,
        on_durable_event=durable,
    )
    world = World()
    register(app, world)
    async with app:
        points = [crash_at(app, step=target, when=when) for target, when in crashes]
        fired = await play(app, clock, ops, points)
        handle = app.get(EXECUTION)
        result = await handle.result()
        assert isinstance(result, list)
        want = expected(ops)
        for i, op in enumerate(ops):
            if op[0] == "draw":
                k = op[2]
                # The body drew one value, live and on every replay, and the step saw it.
                drawn = world.echoed[k]
                assert result[i] == [drawn[0], drawn[0]]
                assert len(drawn) == 1
                want[i] = result[i]
        assert result == want
        wanted_calls = {k: ATTEMPTS if k in failing(ops) else 1 for k in step_numbers(ops)}
        assert dict(world.calls) == wanted_calls
        log = await app.storage.events.read(EXECUTION)
        check_log(log, ops, fired)
        check_wakes(log, written_at)
        assert await check_replay(app) == [EXECUTION]
        assert await app.storage.events.read(EXECUTION) == log
        assert errors == []
        return fired, [e.kind for e in log].count(EventKind.EXECUTION_SUSPENDED)


@settings(
    max_examples=300,
    deadline=None,  # never a duration: only what the run did is checked
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plans())
def test_a_drawn_workflow_killed_at_drawn_points_finishes_exactly_once(
    plan: tuple[list[Op], list[Crash]],
) -> None:
    ops, crashes = plan
    fired, parked = asyncio.run(run_plan(ops, crashes))
    event(f"crashes fired: {fired}")
    event(f"parks: {parked}")


@pytest.mark.parametrize(
    ("ops", "crashes"),
    [
        # A receive whose message came before it, after a sleep, killed before the park.
        ([["sleep", 5], ["recv", 0, "early", None, "t0"], ["step", 1]], [("park", "before")]),
        # Two receives on one topic: the first takes the second's early message, the
        # second times out.
        (
            [["recv", 0, "never", 60, "t0"], ["recv", 1, "early", 60, "t0"]],
            [("park", "before")],
        ),
        # A gather of a step and a sleep, killed after the step.
        ([["gather", [["step", 0], ["sleep", 10]]], ["step", 1]], [("s0", "after")]),
        # A recorded uuid handed to a step killed before it runs.
        ([["draw", "uuid", 0], ["fail", 1]], [("s0", "before"), ("s1", "after")]),
    ],
)
def test_chosen_plans_on_memory(ops: list[Op], crashes: list[Crash]) -> None:
    asyncio.run(run_plan(ops, crashes))


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plans())
def test_a_drawn_workflow_on_sqlite_finishes_exactly_once(
    tmp_path: Path, plan: tuple[list[Op], list[Crash]]
) -> None:
    ops, crashes = plan
    with tempfile.TemporaryDirectory(dir=tmp_path) as directory:
        asyncio.run(run_plan(ops, crashes, f"sqlite:///{directory}/loom.db"))
