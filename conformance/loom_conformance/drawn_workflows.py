"""Drawn workflows killed at drawn points: a Hypothesis strategy of plans, the workflow
that plays one, the world around it, and the checks that it finished exactly once.

A *plan* is a workflow, drawn as a list of operations (steps, failing steps, sleeps,
receives whose message comes before the receive, while it waits, or never, gathers of
steps and sleeps, recorded values handed to a step, continue-as-new, a body that raises),
and up to three crash points (before or after any step or continuation, before a park),
whether the world cancels the execution (while it is parked, or instead of recovering it
after a crash), whether a second node shares the store, whether a crashed node recovers
in place or is stopped and replaced by a new app, as a restarted process is, and whether a
node dies at a drawn store call (before the call reaches the store, or after the store did
it and before the node heard back: a process killed between two writes, or with a write
in flight), after which nothing it asks reaches the store and a new app takes its place
(what the dead node was asked is asked again, as a client would, except a message it
stored: that one Loom must deliver without it). The
world knows the execution by the id it started: it sends there, and looks at and cancels
whichever generation is live. With two nodes both poll the timers (so either may answer a
park, and they race for it through the conditional fence), odd messages are sent through
the second, a cancel comes from it, and after a crash each node recovers its own runs.
:func:`check_plan` starts the workflow on an app made by :func:`drawn_app` and plays the
world: it sends the messages, moves the virtual clock to the next wake and, after each
crash, recovers. When the execution ends it checks that

- every step ran exactly once (a crash point fires where the step's record is durable or
  its effect has not happened yet), a failing one once per attempt, and none after a
  cancel, in whichever generation it fell; after a death at a store call, which can lose
  a step's record (or a failed attempt's) after the step ran, at most one attempt more,
  with the same recorded values;
- the result is what the workflow computes (or the failure it raised), the values it drew
  included, and every
  message went to the receive a first-in-first-out inbox gives it, exactly once, though
  some were sent twice under one key;
- no timer or timeout was answered before its wake time;
- each log of the chain is gapless, starts once, ends once with its last event (continued,
  then completed, failed or cancelled), records each call once; the chain records a
  recovery once
  per crash recovered (twice for a crash before a continuation is recorded: the
  predecessor's, then its takeover of the successor);
- every log replays against the code without divergence, appending nothing.

Used by the runtime suite (:mod:`loom_conformance.suites.runtime`, on the store under
test) and by loom-runtime's own tests (with the app's background services). Needs
``loom-runtime``: the kit's ``runtime`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from random import Random
from typing import Any, Final, Literal, TypeAlias, TypeVar

from hypothesis import example
from hypothesis import strategies as st
from loom_runtime import (
    Context,
    Durable,
    ExecutionCancelledError,
    Loom,
    Retry,
    StepFailedError,
    View,
    WorkflowFailedError,
)
from loom_runtime.testing import CrashAt, VirtualClock, check_replay

from loom_conformance.suites._support import field_of
from loom_core import (
    Event,
    EventKind,
    ExecutionAlreadyExistsError,
    JsonValue,
    Storage,
    open_storage,
)

__all__ = [
    "CHOSEN",
    "Crash",
    "DrawnApp",
    "Op",
    "Plan",
    "check_plan",
    "drawn_app",
    "plans",
    "with_chosen_plans",
]

Op: TypeAlias = list[Any]
"""One operation of a drawn workflow, as JSON (the workflow's input is the list):
``["step", k]``, ``["fail", k]``, ``["sleep", seconds]``, ``["recv", k, arrival,
timeout, topic]`` (arrival ``"early"``, ``"late"`` or ``"never"``; its message is
``{"m": k}``, sent on ``topic``; with a sixth item ``"any"`` the receive is
``ctx.receive_any(*TOPICS)``, which gives ``[topic, value]``), ``["gather", [ops]]``
(steps and sleeps), ``["draw", kind, k]`` (``ctx.uuid``,
``ctx.random`` or ``ctx.now``, then a step ``k`` that returns what it is given),
``["cancel"]`` (a long sleep the world answers by cancelling the execution; what follows
it never runs), ``["continue"]`` (``ctx.continue_as_new`` with the ops left and the results
so far), ``["raise"]`` (the body raises: the execution fails, and what follows never
runs)."""

Cancel: TypeAlias = Literal["never", "parked", "crashed"]
"""When the world cancels the execution: never, at its ``["cancel"]`` op, or the first
time it finds the run dead at a crash point (instead of recovering it)."""

Crash: TypeAlias = tuple[str, Literal["before", "after"]]

Kill: TypeAlias = tuple[int | str, Literal["before", "after"]]
"""A death at a store call, and when: the plan's ``n``-th store call (counting both nodes'
calls from the start), or the first call of a method (``"append"``), or of a method on an
execution whose id contains a text (``"append:$inbox:"``: a message stored;
``"append:#"``: a successor created); ``@k`` after a name counts its ``k``-th call instead
(``"append:$inbox:@2"``: the second message stored)."""
"""A crash point: a step's name (``s<k>``), ``"park"`` or ``"continue"``, and when."""

WHEN: Final[tuple[Literal["before", "after"], ...]] = ("before", "after")
WORKFLOW: Final = "drawn"
TOPICS: Final = ("t0", "t1")
"""The topics a drawn receive is on, and all a ``receive_any`` waits for."""
ATTEMPTS: Final = 2
"""Attempts of a failing step."""
ROUNDS: Final = 200
"""How many moves of the world a plan may take before it is called stuck."""
POLL: Final = 1.0
"""The least the clock moves at a time: more than the timer service's poll interval."""
SEED: Final = 7
HOLD: Final = 3600
"""Seconds a ``["cancel"]`` op sleeps: the world cancels it long before."""


@dataclass(frozen=True, slots=True)
class Plan:
    ops: list[Op]
    crashes: list[Crash]
    cancel: Cancel = "never"
    nodes: Literal[1, 2] = 1
    """How many nodes (apps on the one store) serve the execution."""
    restart: bool = False
    """After a crash, the node it hit is stopped and a new app is opened in its place (on
    the same store, or on the same file: a SQLite URL is opened again), as a restarted
    process would be; else the node recovers in place."""
    kill: Kill | None = None
    """A process death at a store call: the node making the call dies before the call
    reaches the store or after the store has done it, before the node hears back. Nothing
    the node does after that reaches the store; the world restarts it (a new app) and
    recovers."""


CHOSEN: Final[tuple[Plan, ...]] = (
    # A message sent while its receiver sleeps: it must not cut the sleep short.
    Plan([["sleep", 5], ["recv", 0, "early", None, "t0"], ["step", 1]], [("park", "before")]),
    # Two receives on one topic: the first takes the second's early message, the second
    # times out.
    Plan([["recv", 0, "never", 60, "t0"], ["recv", 1, "early", 60, "t0"]], [("park", "before")]),
    # A receive_any takes the next receive's early message (the oldest on its topics),
    # so that receive times out; a later receive_any takes its own.
    Plan(
        [["recv", 0, "late", None, "t1", "any"], ["recv", 1, "early", 60, "t0"],
         ["recv", 2, "early", None, "t1", "any"]],
        [("park", "before")],
    ),
    # A gather of a step and a sleep, killed after the step.
    Plan([["gather", [["step", 0], ["sleep", 10]]], ["step", 1]], [("s0", "after")]),
    # A recorded uuid handed to a step killed before it runs; a failing step killed after
    # its failure is recorded.
    Plan([["draw", "uuid", 0], ["fail", 1]], [("s0", "before"), ("s1", "after")]),
    # A step's result pending when the body parks in a gather, killed before that park.
    Plan([["step", 0], ["gather", [["sleep", 0], ["sleep", 10]]]], [("park", "before")]),
    # A receive parked just before its early message is stored: with a real store's I/O,
    # the task that parked it is still answering its own park when the world looks (the
    # world must wait for it, as drain does).
    Plan([["draw", "uuid", 0], ["recv", 1, "early", None, "t0"], ["step", 2]], [("s2", "before")]),
    # Cancelled while parked, after a crash before that park; the step after never runs.
    Plan([["step", 0], ["cancel"], ["step", 1]], [("park", "before")], "parked"),
    # Cancelled instead of recovered after a crash that followed a recorded step.
    Plan([["step", 0], ["step", 1], ["step", 2]], [("s1", "after")], "crashed"),
    # Killed between creating the successor and recording the continuation: the successor
    # must run once, and the message left behind must reach it.
    Plan(
        [["recv", 0, "early", None, "t0"], ["continue"], ["recv", 1, "early", None, "t0"],
         ["step", 2]],
        [("continue", "before")],
    ),
    # Killed after the continuation, before handing on: a late message sent to the first
    # generation, and one left in it.
    Plan(
        [["sleep", 5], ["continue"], ["recv", 0, "early", None, "t1"],
         ["recv", 1, "late", None, "t1"]],
        [("continue", "after")],
    ),
    # Two nodes: the second sends while the first answers its own park; the send must not
    # fail for the contention (the message is stored, and the timers deliver it).
    Plan([["step", 0], ["recv", 1, "early", 60, "t0"]], [], nodes=2),
    # Two nodes: the second answers a park the first wrote, then dies after a step; it
    # recovers its own run, and the first answers the next park.
    Plan(
        [["sleep", 5], ["step", 0], ["recv", 1, "late", None, "t0"], ["sleep", 5]],
        [("s0", "after")],
        nodes=2,
    ),
    # Two nodes, each node restarted after a crash on it: a new app (on a new connection
    # to a file store) takes over what the old one left, around a continuation too.
    Plan(
        [["sleep", 5], ["step", 0], ["recv", 1, "late", None, "t0"], ["continue"],
         ["step", 2], ["recv", 3, "early", 60, "t1"]],
        [("s0", "after"), ("continue", "before"), ("s2", "before")],
        nodes=2,
        restart=True,
    ),
    # Two nodes, the second killed after storing a message for a parked receiver and
    # before waking it: nobody sends it again, and it must still be delivered.
    Plan(
        [["step", 0], ["recv", 1, "late", None, "t0"], ["step", 2]],
        [],
        nodes=2,
        kill=("append:$inbox:", "after"),
    ),
    # A sender killed after storing a message for an execution that has continued as
    # new, before handing it on: the wake row it left must get it to the successor.
    Plan([["continue"], ["recv", 1, "late", None, "t0"]], [], kill=("append:$inbox:", "after")),
    # The same with a message consumed before the continuation: the restarted node's timer
    # loop has not polled when the world looks, and the wake row is the first generation's.
    Plan(
        [["recv", 0, "early", None, "t0"], ["continue"], ["recv", 1, "late", None, "t0"]],
        [],
        kill=("append:$inbox:@2", "after"),
    ),
    # Killed after it took the fence to deliver a message, before it delivered it.
    Plan(
        [["step", 0], ["sleep", 5], ["recv", 1, "late", None, "t0"], ["continue"], ["step", 2]],
        [],
        nodes=2,
        kill=("acquire_fence_if", "after"),
    ),
    # Killed after creating the successor, before recording the continuation.
    Plan(
        [["step", 0], ["sleep", 5], ["recv", 1, "late", None, "t0"], ["continue"], ["step", 2]],
        [],
        nodes=2,
        kill=("append:#", "after"),
    ),
    # A failing step killed as it records its first failed attempt, then as it records
    # its last failure: each death repeats one attempt, never the step's whole count.
    Plan([["fail", 0], ["step", 1]], [], kill=("append@2", "before")),
    Plan([["fail", 0], ["step", 1]], [], kill=("append@3", "before")),
)
"""Plans every run tries before the drawn ones, whatever Hypothesis draws."""

T = TypeVar("T", bound=Callable[..., Any])
R = TypeVar("R")


def with_chosen_plans(test: T) -> T:
    """Add :data:`CHOSEN` to a ``@given(plan=plans())`` test as explicit examples."""
    for plan in reversed(CHOSEN):
        test = example(plan=plan)(test)
    return test


# -- the drawn plans -----------------------------------------------------------------------


@st.composite
def _workflows(draw: st.DrawFn, cancel: Cancel) -> list[Op]:
    numbers = iter(range(1000))
    ops: list[Op] = []
    for _ in range(draw(st.integers(min_value=1, max_value=7))):
        kind = draw(
            st.sampled_from(
                ["step", "fail", "sleep", "recv", "recv", "gather", "draw", "continue", "raise"]
            )
        )
        if kind in ("continue", "raise"):
            ops.append([kind])
        elif kind in ("step", "fail"):
            ops.append([kind, next(numbers)])
        elif kind == "sleep":
            ops.append(["sleep", draw(st.sampled_from([0, 0, 5, 30]))])
        elif kind == "recv":
            arrival = draw(st.sampled_from(["early", "late", "never"]))
            topic = f"t{draw(st.integers(min_value=0, max_value=1))}"
            op = ["recv", next(numbers), arrival, draw(st.sampled_from([None, 60])), topic]
            if draw(st.sampled_from([False, False, True])):
                op.append("any")
            ops.append(op)
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
    if cancel == "parked":
        ops.insert(draw(st.integers(min_value=0, max_value=len(ops))), ["cancel"])
    # A receive that will get no message waits for its timeout: give it one.
    for op, received in zip(ops, _messages(ops)[0], strict=True):
        if op[0] == "recv" and received is None:
            op[3] = 60
    return ops


@st.composite
def _plans(draw: st.DrawFn) -> Plan:
    cancel: Cancel = draw(st.sampled_from(["never", "never", "never", "parked", "crashed"]))
    nodes: Literal[1, 2] = draw(st.sampled_from([1, 2]))
    ops = draw(_workflows(cancel))
    targets = [f"s{k}" for k in _step_numbers(ops)]
    if _parks(ops):
        targets.append("park")
    if any(op[0] == "continue" for op in ops):
        targets.append("continue")
    crashes: list[Crash] = []
    for _ in range(draw(st.integers(min_value=0, max_value=3 if targets else 0))):
        target = draw(st.sampled_from(targets))
        when: Literal["before", "after"] = (
            "before" if target == "park" else draw(st.sampled_from(["before", "after"]))
        )
        crashes.append((target, when))
    restart = bool(crashes) and draw(st.booleans())
    kill: Kill | None = None
    if draw(st.booleans()):
        kill = (draw(st.integers(min_value=0, max_value=60)), draw(st.sampled_from(WHEN)))
    return Plan(ops, crashes, cancel, nodes, restart, kill)


def plans() -> st.SearchStrategy[Plan]:
    """Plans: a workflow of one to seven operations, up to three crash points, whether and
    when the world cancels it, on one node or two, and whether a crashed node recovers in
    place or is restarted."""
    return _plans()


def _step_numbers(ops: Sequence[Op]) -> list[int]:
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


def _parks(ops: Sequence[Op]) -> bool:
    return any(
        op[0] in ("sleep", "recv", "cancel")
        or (op[0] == "gather" and any(b[0] == "sleep" for b in op[1]))
        for op in ops
    )


def _live(ops: Sequence[Op]) -> Sequence[Op]:
    """The ops the body gets to: those before a ``["cancel"]`` or a ``["raise"]``."""
    for i, op in enumerate(ops):
        if op[0] in ("cancel", "raise"):
            return ops[:i]
    return ops


def _fails(ops: Sequence[Op]) -> bool:
    """Whether the body gets to a ``["raise"]`` (before any ``["cancel"]``)."""
    live = len(_live(ops))
    return live < len(ops) and ops[live][0] == "raise"


def _messages(ops: Sequence[Op]) -> tuple[list[JsonValue], list[tuple[str, JsonValue]]]:
    """What each op's receive gets (None for other ops), and every message consumed, in
    order. The early messages are all sent at the start, in the order of their receives;
    a late one when its receive waits. A receive takes the oldest message on its topic, a
    receive_any the oldest on any of :data:`TOPICS`."""
    stored: deque[tuple[str, JsonValue]] = deque(
        (op[4], {"m": op[1]}) for op in ops if op[0] == "recv" and op[2] == "early"
    )
    got: list[JsonValue] = []
    consumed: list[tuple[str, JsonValue]] = []
    live = len(_live(ops))
    for i, op in enumerate(ops):
        value: JsonValue = None
        if op[0] == "recv" and i < live:
            listens = TOPICS if _any(op) else (op[4],)
            taken = next((m for m in stored if m[0] in listens), None)
            if taken is not None:
                stored.remove(taken)
            elif op[2] == "late":
                taken = (op[4], {"m": op[1]})
            if taken is not None:
                consumed.append(taken)
                value = [taken[0], taken[1]] if _any(op) else taken[1]
        got.append(value)
    return got, consumed


def _any(op: Op) -> bool:
    """Whether a ``recv`` op is a ``receive_any``."""
    return len(op) > 5 and op[5] == "any"


def _waits(ops: Sequence[Op]) -> dict[tuple[int, ...], Op]:
    """Each receive and cancel op by the position its call takes: one per call, two for a
    draw (the value and its step), and a gather's own after its branches'."""
    found: dict[tuple[int, ...], Op] = {}
    counter = 0
    for op in ops:
        if op[0] in ("recv", "cancel"):
            found[(counter,)] = op
        if op[0] == "gather":
            counter += len(op[1]) + 1
        else:
            counter += 2 if op[0] == "draw" else 1
    return found


def _expected(ops: Sequence[Op]) -> list[JsonValue]:
    """The workflow's result, with each drawn value as None (the log decides it)."""
    out: list[JsonValue] = []
    for op, received in zip(ops, _messages(ops)[0], strict=True):
        if op[0] == "step":
            out.append(f"v{op[1]}")
        elif op[0] == "fail":
            out.append(f"failed:{op[1]}")
        elif op[0] == "sleep":
            out.append("slept")
        elif op[0] == "recv":
            out.append(received)
        elif op[0] == "gather":
            out.append([f"v{b[1]}" if b[0] == "step" else None for b in op[1]])
        elif op[0] == "continue":
            out.append("continued")
        else:
            out.append(None)
    return out


def _generations(ops: Sequence[Op]) -> list[Sequence[Op]]:
    """The ops each generation runs: split at every ``["continue"]``."""
    split: list[Sequence[Op]] = []
    start = 0
    for i, op in enumerate(ops):
        if op[0] == "continue":
            split.append(ops[start:i])
            start = i + 1
    split.append(ops[start:])
    return split


# -- the workflow and the world around it --------------------------------------------------


class _World:
    """The effects outside Loom: how often each step ran, and what each echo was given."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, int]] = Counter()
        self.echoed: dict[tuple[str, int], list[JsonValue]] = {}

    async def step(self, execution_id: str, k: int) -> str:
        self.calls[execution_id, k] += 1
        return f"v{k}"

    async def fail(self, execution_id: str, k: int) -> str:
        self.calls[execution_id, k] += 1
        raise RuntimeError(f"step {k} always fails")

    async def echo(self, execution_id: str, k: int, value: JsonValue) -> JsonValue:
        self.calls[execution_id, k] += 1
        self.echoed.setdefault((execution_id, k), []).append(value)
        return value


def _register(app: Loom, world: _World) -> None:
    """Register the workflow that plays a drawn list of ops."""

    def branch(ctx: Context, op: Op) -> Durable[Any]:
        if op[0] == "step":
            me = ctx.execution_id.partition("#")[0]
            return ctx.step(world.step, me, op[1], name=f"s{op[1]}")
        return ctx.sleep(op[1])

    @app.workflow(name=WORKFLOW)
    async def drawn(ctx: Context, ops: list[Op], done: list[JsonValue] | None = None) -> object:
        me = ctx.execution_id.partition("#")[0]  # the world's id, in every generation
        out: list[JsonValue] = [] if done is None else done
        for i, op in enumerate(ops):
            if op[0] == "continue":
                ctx.continue_as_new(ops[i + 1 :], [*out, "continued"])
            elif op[0] == "raise":
                raise RuntimeError(f"drawn failure after {out!r}")
            elif op[0] == "step":
                out.append(await ctx.step(world.step, me, op[1], name=f"s{op[1]}"))
            elif op[0] == "fail":
                retry = Retry(attempts=ATTEMPTS, initial_interval=0)
                try:
                    await ctx.step(world.fail, me, op[1], name=f"s{op[1]}", retry=retry)
                except StepFailedError:
                    out.append(f"failed:{op[1]}")
            elif op[0] == "sleep":
                await ctx.sleep(op[1])
                out.append("slept")
            elif op[0] == "recv" and _any(op):
                got = await ctx.receive_any(*TOPICS, timeout=op[3])
                out.append(None if got is None else [got.topic, got.value])
            elif op[0] == "recv":
                out.append(await ctx.receive(op[4], timeout=op[3]))
            elif op[0] == "gather":
                out.append(list(await ctx.gather(*(branch(ctx, b) for b in op[1]))))
            elif op[0] == "cancel":
                await ctx.sleep(HOLD)
                out.append("not cancelled")
            else:
                value: JsonValue
                if op[1] == "uuid":
                    value = str(ctx.uuid())
                elif op[1] == "random":
                    value = ctx.random()
                else:
                    value = ctx.now().isoformat()
                echoed = await ctx.step(world.echo, me, op[2], value, name=f"s{op[2]}")
                out.append([value, echoed])
        return out


class _Killed(BaseException):
    """A node's process died at a store call. A BaseException, as a death is not an error
    the node's code may handle: nothing it does afterwards reaches the store anyway."""


@dataclass(slots=True, eq=False)
class _Life:
    """One app's life: over at the plan's kill, and over for good."""

    dead: bool = False


@dataclass(slots=True)
class _Deaths:
    """Counts every node's store calls, and kills the node making the call a plan's kill
    names."""

    at: int | str | None = None
    when: Literal["before", "after"] = "before"
    calls: int = 0
    named: int = 0
    """The calls so far that a named kill's name matches."""
    killed: bool = False
    """Whether the kill landed (a plan may end before the call it names)."""
    killed_at: datetime | None = None
    dying: _Life | None = None
    """The node whose call is the kill, made after the call: it dies as the call returns."""

    def arm(self, kill: Kill | None) -> None:
        self.at, self.when = kill if kill is not None else (None, "before")
        self.calls, self.named, self.killed, self.killed_at, self.dying = 0, 0, False, None, None

    def disarm(self) -> None:
        """No more kills (what they did is kept, for the checks)."""
        self.at = None

    def enter(self, life: _Life, now: datetime, method: str, args: tuple[Any, ...]) -> None:
        if life.dead:
            raise _Killed("this node is dead")
        n, self.calls = self.calls, self.calls + 1
        if self.at is None or not self._names(self.at, n, method, args):
            return
        self.at, self.killed, self.killed_at = None, True, now
        if self.when == "before":
            life.dead = True
            raise _Killed(f"killed before store call {n} ({method})")
        self.dying = life  # the call goes through; the node dies as it returns

    def _names(self, at: int | str, n: int, method: str, args: tuple[Any, ...]) -> bool:
        if isinstance(at, int):
            return n == at
        name, _, k = at.partition("@")
        wanted, _, text = name.partition(":")
        if method != wanted:
            return False
        target = getattr(args[0], "execution_id", args[0]) if args else ""
        if not (isinstance(target, str) and text in target):
            return False
        self.named += 1
        return self.named == int(k or 1)

    def leave(self, life: _Life) -> None:
        if self.dying is life:
            self.dying = None
            life.dead = True
        if life.dead:
            raise _Killed("killed after a store call")


class _Mortal:
    """One store of a node's storage, that dies with the node: each coroutine method
    counts as a store call (see :class:`_Deaths`); everything else is the store's own."""

    __slots__ = ("_clock", "_deaths", "_inner", "_life")

    def __init__(self, inner: object, deaths: _Deaths, life: _Life, clock: VirtualClock) -> None:
        self._inner, self._deaths, self._life, self._clock = inner, deaths, life, clock

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(value):
            return value
        deaths, life, clock = self._deaths, self._life, self._clock

        async def call(*args: Any, **kwargs: Any) -> Any:
            deaths.enter(life, clock.now(), name, args)
            result = await value(*args, **kwargs)
            deaths.leave(life)
            return result

        return call


def _mortal(storage: Storage, deaths: _Deaths, life: _Life, clock: VirtualClock) -> Storage:
    """``storage`` as one node sees it: dead with the node (never close it: close
    ``storage``)."""
    return Storage(
        _Mortal(storage.events, deaths, life, clock),
        _Mortal(storage.timers, deaths, life, clock),
        _Mortal(storage.leases, deaths, life, clock),
        url=storage.url,
    )


@dataclass(slots=True)
class DrawnApp:
    """Two apps on one store (``app`` and a second node, ``peer``) that run drawn plans,
    with their virtual clock and what their hooks saw."""

    app: Loom
    peer: Loom
    clock: VirtualClock
    services: bool
    world: _World = field(default_factory=_World)
    reported: list[BaseException] = field(default_factory=list)
    written_at: dict[tuple[str, int], datetime] = field(default_factory=dict)
    """The virtual time each event was durable at, by execution and sequence."""
    crashed: set[int] = field(default_factory=set)
    """The nodes (0: ``app``, 1: ``peer``) a crash point fired on since the last restart."""
    restarts: int = 0
    deaths: _Deaths = field(default_factory=_Deaths)
    lives: dict[int, _Life] = field(default_factory=dict)
    _open: Callable[[int], Awaitable[Loom]] | None = None
    _close: Callable[[int], Awaitable[None]] | None = None

    @property
    def nodes(self) -> tuple[Loom, Loom]:
        return self.app, self.peer

    def dead(self) -> list[int]:
        """The nodes killed at a store call and not restarted yet."""
        return [index for index, life in sorted(self.lives.items()) if life.dead]

    async def restart(self, index: int) -> Loom:
        """Stop node ``index`` as a killed process stops (its runs where they are) and open
        a new app in its place, with the same options, crash points and hooks."""
        assert self._open is not None
        assert self._close is not None
        points = self.nodes[index].crash_points
        await self._close(index)
        new = await self._open(index)
        new.crash_points.extend(points)
        if index == 0:
            self.app = new
        else:
            self.peer = new
        self.restarts += 1
        return new


@contextlib.asynccontextmanager
async def drawn_app(
    storage: str | Storage, *, node: str, services: bool
) -> AsyncIterator[DrawnApp]:
    """Two ``Loom(storage)`` apps entered (nodes ``node`` and ``node + "-2"``), on one
    virtual clock and seeded randoms, with the drawn workflow registered on both (a URL is
    opened once, for both). ``services``: the first app's own timer loop and recovery on
    entry run (else :func:`check_plan` polls its timer service itself once each time
    round, before it looks at the execution, so a real store's I/O never races the
    clock). The second node's are always polled by :func:`check_plan`, and only in a plan
    on two nodes. :meth:`DrawnApp.restart` replaces a node by a new app with the same
    options; a SQLite (any file) URL is opened again for it, a ``memory://`` store or a
    ``Storage`` given is shared."""
    clock = VirtualClock()
    reported: list[BaseException] = []
    written_at: dict[tuple[str, int], datetime] = {}

    def durable(event: Event) -> None:
        written_at[event.execution_id, event.sequence] = clock.now()

    world = _World()
    deaths = _Deaths()
    lives: dict[int, _Life] = {}
    url = storage if isinstance(storage, str) and not storage.startswith("memory:") else None
    async with contextlib.AsyncExitStack() as stack:
        if isinstance(storage, str):
            storage = await stack.enter_async_context(open_storage(storage))
        shared = storage
        running: dict[int, Loom] = {}
        opened: dict[int, Storage] = {}
        starts: Counter[int] = Counter()

        async def start(index: int) -> Loom:
            # A restarted node opens a file-backed URL again, as a new process would.
            here = shared
            if index in running and url is not None:
                here = opened[index] = await open_storage(url)
            life = lives[index] = _Life()

            def report(error: BaseException) -> None:
                if not life.dead:  # what a dead node says is lost with it
                    reported.append(error)

            app = Loom(
                _mortal(here, deaths, life, clock),
                node=node if index == 0 else f"{node}-2",
                clock=clock,
                random=Random(SEED + index + 2 * starts[index]),
                on_error=report,
                on_durable_event=durable,
                timers=services and index == 0,
                recover=services and index == 0,
            )
            _register(app, world)
            await app.__aenter__()
            running[index] = app
            starts[index] += 1
            return app

        async def stop(index: int) -> None:
            await running[index].__aexit__(None, None, None)
            if index in opened:
                await opened.pop(index).close()

        # A dead node's run tasks end with its death, and nobody waits for them (a killed
        # process's tasks are not reported either): keep that out of the loop's log.
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()

        def quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if isinstance(context.get("exception"), _Killed):
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(quiet)
        try:
            app = await start(0)
            peer = await start(1)
            yield DrawnApp(
                app, peer, clock, services, world, reported, written_at,
                deaths=deaths, lives=lives, _open=start, _close=stop,
            )
        finally:
            for index in reversed(sorted(running)):
                await stop(index)
            gc.collect()  # the dead nodes' tasks, while the handler above still listens
            loop.set_exception_handler(previous)


@dataclass(slots=True)
class _Played:
    """What the world did while a plan ran."""

    fired: int = 0
    """Crash points that fired (each is recovered once: one EXECUTION_RECOVERED)."""
    cancelled: bool = False
    """In a plan that cancels on a crash: cancelled instead of recovered, so one crash
    fewer to recover, unless a run this app had already recovered was what the world
    found running (with the app's own services, a look can come between a run's crash and
    its recovery by an earlier look's ``recover()``, and the cancel then stops a live
    run)."""
    asked: bool = False
    """Whether the world asked for the cancel (a cancel asked again after its node died
    can find the execution finished by the restarted node)."""


async def check_plan(drawn: DrawnApp, plan: Plan, execution_id: str) -> tuple[int, int]:
    """Play ``plan`` as ``execution_id`` and check it (see the module docstring); returns
    the crashes that fired and the parks the log holds."""
    points = [_arm(drawn, target, when, execution_id) for target, when in plan.crashes]
    played = await _play(drawn, plan, points, execution_id)
    app = drawn.app  # a node restarted while it played is a new app
    # A process death at a store call may lose a step's record after the step ran: it runs
    # again (at least once), with what the log holds, so with the same drawn value.
    killed = drawn.deaths.killed
    logs = await _chain(app, execution_id)
    log = [e for generation in logs for e in generation]
    ran = {k: n for (e, k), n in drawn.world.calls.items() if e == execution_id}
    failing = {op[1] for op in plan.ops if op[0] == "fail"}
    if played.cancelled:
        try:
            await app.get(execution_id).result()
        except ExecutionCancelledError:
            pass
        else:
            raise AssertionError(f"{execution_id} was cancelled and has a result")
        if plan.cancel == "parked":
            stepped = _step_numbers(_live(plan.ops))
        else:
            # Cut short by the cancel: the steps whose records the log holds ran, once.
            # With the app's own services the cancel may have stopped a live run (see
            # _Played), and one more step may have run before its record was refused.
            stepped = [int(str(name)[1:]) for name in _recorded_steps(log)]
            unrecorded = {k: n for k, n in ran.items() if k not in stepped}
            assert len(unrecorded) <= (1 if drawn.services else 0) + killed, (
                f"{execution_id}: steps ran after the cancel with no record: {unrecorded}"
            )
            assert all(
                n <= (ATTEMPTS if k in failing else 1) + killed
                for k, n in unrecorded.items()
            ), f"{execution_id}: an unrecorded step ran too often (step: runs): {unrecorded}"
            ran = {k: n for k, n in ran.items() if k in stepped}
        for op in plan.ops:
            if op[0] == "draw" and (execution_id, op[2]) in drawn.world.echoed:
                _one_value(drawn.world.echoed[execution_id, op[2]], killed)
    elif _fails(plan.ops):
        failure: WorkflowFailedError | None = None
        try:
            await app.get(execution_id).result()
        except WorkflowFailedError as failed:
            failure = failed
        assert failure is not None, f"{execution_id} raised and has a result"
        assert "drawn failure" in str(failure), failure
        stepped = _step_numbers(_live(plan.ops))
        for op in _live(plan.ops):
            if op[0] == "draw":
                _one_value(drawn.world.echoed[execution_id, op[2]], killed)
    else:
        result = await app.get(execution_id).result()
        assert isinstance(result, list), result
        want = _expected(plan.ops)
        for i, op in enumerate(plan.ops):
            if op[0] == "draw":
                # The body drew one value, live and on every replay, and the step saw it.
                echoed = drawn.world.echoed[execution_id, op[2]]
                _one_value(echoed, killed)
                assert result[i] == [echoed[0], echoed[0]], (result[i], echoed)
                want[i] = result[i]
        assert result == want, f"{execution_id}: result {result!r}, expected {want!r}"
        stepped = _step_numbers(plan.ops)
    runs = {k: ATTEMPTS if k in failing else 1 for k in stepped}
    if killed:
        assert ran.keys() == runs.keys(), (
            f"{execution_id}: the steps that ran {sorted(ran)} are not the plan's "
            f"{sorted(runs)}"
        )
        # One death repeats at most one attempt: the one it cut short, or whose record
        # it lost (a failing step's earlier attempts are in the log, and count).
        assert all(runs[k] <= n <= runs[k] + 1 for k, n in ran.items()), (
            f"{execution_id}: a step ran more often than a death allows (step: runs, "
            f"expected per step {runs}): {ran}"
        )
    else:
        assert ran == runs, (
            f"{execution_id}: with no death, each step runs exactly once (a failing one "
            f"{ATTEMPTS} times); step: runs were {ran}, expected {runs}: a recorded step "
            "ran again, or a live run was fenced out"
        )
    taken_over = sum(
        point.count
        for point, crash in zip(points, plan.crashes, strict=True)
        if crash == ("continue", "before")
    )
    _check_logs(logs, plan, played, drawn.services, taken_over, killed)
    for generation in logs:
        _check_wakes(generation, drawn.written_at, drawn.deaths.killed_at)
    ids = [generation[0].execution_id for generation in logs]
    assert await check_replay(app, ids) == ids
    assert await _chain(app, execution_id) == logs, f"{execution_id}: the chain's logs changed"
    assert drawn.reported == [], f"{execution_id}: the runtime reported {drawn.reported!r}"
    return played.fired, [e.kind for e in log].count(EventKind.EXECUTION_SUSPENDED)


def _one_value(echoed: list[JsonValue], killed: bool) -> None:
    """A drawn value's echo step saw one value: once, or twice after a death (the value is
    durable before the step runs)."""
    assert len(echoed) == 1 or (killed and len(echoed) == 2), echoed
    assert all(value == echoed[0] for value in echoed), echoed


def _arm(
    drawn: DrawnApp, target: str, when: Literal["before", "after"], root: str
) -> CrashAt:
    """A crash point at ``target`` in any generation of ``root``'s chain, on either node
    (it fires once, wherever the run is)."""
    point = CrashAt(target, None, when)

    for index, node in enumerate(drawn.nodes):

        def fire(
            execution_id: str, position: tuple[int, ...], name: str, moment: str,
            index: int = index,
        ) -> bool:
            if execution_id.partition("#")[0] == root and point(
                execution_id, position, name, moment
            ):
                drawn.crashed.add(index)
                return True
            return False

        node.crash_points.append(fire)
    return point


async def _chain(app: Loom, execution_id: str) -> list[tuple[Event, ...]]:
    """The logs of ``execution_id`` and of each successor it continued as, in order."""
    logs: list[tuple[Event, ...]] = []
    while True:
        log = await app.storage.events.read(execution_id)
        logs.append(log)
        if not log or log[-1].kind != EventKind.EXECUTION_CONTINUED:
            return logs
        execution_id = str(field_of(log[-1], "successor"))


async def _live_view(app: Loom, execution_id: str) -> View:
    """The view of the generation of ``execution_id``'s chain that has not continued."""
    view = await app.inspect(execution_id)
    while view.status == "continued" and view.successor is not None:
        view = await app.inspect(view.successor)
    return view


async def _play(
    drawn: DrawnApp, plan: Plan, points: list[CrashAt], execution_id: str
) -> _Played:
    """Start the workflow and play the world until the execution ends; the plan's kill is
    armed while it plays."""
    drawn.deaths.arm(plan.kill)
    try:
        return await _play_armed(drawn, plan, points, execution_id)
    finally:
        drawn.deaths.disarm()


async def _play_armed(
    drawn: DrawnApp, plan: Plan, points: list[CrashAt], execution_id: str
) -> _Played:
    clock, ops = drawn.clock, plan.ops

    def apps() -> tuple[Loom, ...]:
        return drawn.nodes[: plan.nodes]

    async def revive() -> None:
        # A node killed at a store call is restarted, as its process would be, and
        # recovers what it left, as a restarted process does on entry.
        for index in drawn.dead():
            await drawn.restart(index)
            if index < plan.nodes:
                await act(index, lambda node: node.recover())

    async def act(index: int, action: Callable[[Loom], Awaitable[R]]) -> tuple[R, bool]:
        """What the world asks node ``index`` (the first node: -1 is the last in use),
        asked again of its restarted self if the node dies meanwhile, as a client retries;
        and whether it was."""
        retried = False
        while True:
            try:
                return await action(apps()[index]), retried
            except _Killed:
                await revive()
                retried = True

    generations = [_waits(generation) for generation in _generations(ops)]
    sent: set[int] = set()
    played = _Played()

    async def send(op: Op) -> None:
        index, key = op[1] % plan.nodes, f"m{op[1]}"

        def once(node: Loom) -> Awaitable[int]:
            return node.send(execution_id, op[4], {"m": op[1]}, key=key)

        try:
            await once(apps()[index])
        except _Killed:
            # The sender died. A message it stored is Loom's to deliver (the sender's
            # process is gone, and nobody sends it again); one it did not store is sent
            # again, as a client whose send failed would.
            await revive()
            stored, _ = await act(0, lambda node: node.inbox.messages(execution_id))
            if all(message.key != key for message in stored):
                await act(index, once)
        if op[1] % 2 == 0:
            await act(index, once)  # again under its key: this must change nothing
        sent.add(op[1])

    async def cancel() -> None:
        played.asked = True
        cancelled, retried = await act(-1, lambda node: node.cancel(execution_id, reason="drawn"))
        if not cancelled:
            # Asked again after its node died: the first attempt may have landed, or the
            # restarted node's recovery may have finished the execution meanwhile.
            assert retried
            view, _ = await act(0, lambda node: _live_view(node, execution_id))
            cancelled = view.status == "cancelled"
        played.cancelled = cancelled

    async def start(node: Loom) -> None:
        try:
            await node.start(WORKFLOW, ops, id=execution_id)
        except ExecutionAlreadyExistsError:
            assert drawn.deaths.killed  # the start that died had written it
    await act(0, start)
    for op in ops:
        if op[0] == "recv" and op[2] == "early":
            await send(op)
    for _ in range(ROUNDS):
        for index, node in enumerate(apps()):
            if not drawn.services or node is drawn.peer:
                # The poll a timer loop would make now: what is due fires, nothing else may.
                await act(index, lambda node: node.timer_service.poll_once())
        for node in apps():
            await node.drain()
        await revive()
        view, _ = await act(0, lambda node: _live_view(node, execution_id))
        waiting = generations[view.generation]
        if view.terminal:
            played.fired = sum(point.count for point in points)
            return played
        if view.status == "running":
            fired = sum(point.count for point in points)
            # A run that died at a crash point since the last look: what a restarted
            # process does, unless the plan cancels it instead (and then recovery must
            # leave it alone).
            crashed, played.fired = fired > played.fired, fired
            if crashed and plan.cancel == "crashed" and not played.asked:
                await cancel()
            if crashed and plan.restart:
                for index in sorted(drawn.crashed):
                    await drawn.restart(index)
                drawn.crashed.clear()
            for index in range(plan.nodes):
                await act(index, lambda node: node.recover())
            continue
        waits = view.pending_waits()
        if any(waiting.get(w.position, [""])[0] == "cancel" for w in waits):
            await cancel()
            continue
        late = [
            waiting[w.position]
            for w in waits
            if w.call in ("receive", "receive_any")
            and waiting[w.position][2] == "late"
            and waiting[w.position][1] not in sent
        ]
        if late:
            for op in late:
                await send(op)
            continue
        wakes = [w.wake_at for w in waits if w.wake_at is not None]
        if not wakes:
            # A message stored by a sender that died before it delivered: its wake row is
            # due, for a timer loop to fire (a restarted node's loop may not have polled
            # yet). The row is the generation's the message was sent to, which may have
            # continued since: its delivery hands the message on.
            async def pending(node: Loom) -> list[datetime]:
                found: list[datetime] = []
                at: str | None = execution_id
                while at is not None:
                    found += [row.wake_at for row in await node.storage.timers.pending(at)]
                    generation = await node.inspect(at)
                    at = generation.successor if generation.status == "continued" else None
                return found

            wakes, _ = await act(0, pending)
        assert wakes, f"{execution_id} is parked with nothing that can wake it: {waits}"
        await clock.advance(max((min(wakes) - clock.now()).total_seconds(), POLL))
    raise AssertionError(
        f"not finished after {ROUNDS} rounds: {await _live_view(drawn.app, execution_id)}"
    )


# -- the checks ----------------------------------------------------------------------------

_TERMINAL: Final = frozenset(
    {
        EventKind.EXECUTION_COMPLETED,
        EventKind.EXECUTION_FAILED,
        EventKind.EXECUTION_CANCELLED,
        EventKind.EXECUTION_CONTINUED,
    }
)


def _check_logs(
    logs: Sequence[Sequence[Event]],
    plan: Plan,
    played: _Played,
    services: bool,
    taken_over: int,
    killed: bool,
) -> None:
    ending = (
        EventKind.EXECUTION_CANCELLED
        if played.cancelled
        else EventKind.EXECUTION_FAILED
        if _fails(plan.ops)
        else EventKind.EXECUTION_COMPLETED
    )
    for i, generation in enumerate(logs):
        kinds = [e.kind for e in generation]
        where = f"{generation[0].execution_id if generation else '?'}: log {kinds}"
        sequences = [e.sequence for e in generation]
        assert sequences == list(range(len(generation))), f"{where}: gaps {sequences}"
        assert kinds.count(EventKind.EXECUTION_STARTED) == 1, f"{where}: not one start"
        assert kinds[0] == EventKind.EXECUTION_STARTED, f"{where}: does not begin started"
        last = ending if i == len(logs) - 1 else EventKind.EXECUTION_CONTINUED
        assert [k for k in kinds if k in _TERMINAL] == [last], f"{where}: not one {last}"
        assert kinds[-1] == last, f"{where}: does not end {last}"
        recorded = [
            tuple(field_of(e, "position"))  # type: ignore[arg-type]
            for e in generation
            if e.kind in (EventKind.STEP_COMPLETED, EventKind.STEP_FAILED)
        ]
        assert len(recorded) == len(set(recorded)), f"a call recorded twice: {recorded}"
    if not played.cancelled:
        assert len(logs) == len(_generations(_live(plan.ops))), (
            f"{len(logs)} generations, the plan has {len(_generations(_live(plan.ops)))}"
        )
    log = [e for generation in logs for e in generation]
    kinds = [e.kind for e in log]
    delivered = [
        (field_of(e, "topic"), field_of(e, "value"))
        for e in log
        if e.kind == EventKind.MESSAGE_CONSUMED
    ]
    expected = _messages(plan.ops)[1]
    if plan.cancel == "crashed" and played.cancelled:
        expected = expected[: len(delivered)]  # cut short wherever the crash was
    assert delivered == expected, (
        f"messages consumed (topic, value) {delivered}, expected each once, in order: "
        f"{expected}"
    )
    recoveries = kinds.count(EventKind.EXECUTION_RECOVERED)
    # A death recovers the run it stopped, if one ran: and a run continuing as new, its
    # successor too.
    deaths = (0, 1, 2) if killed else (0,)
    if played.cancelled and plan.cancel == "crashed":
        allowed = (
            (played.fired - 1, played.fired, played.fired + taken_over)
            if services
            else (played.fired - 1,)
        )
        assert any(recoveries - d in allowed for d in deaths), (recoveries, played.fired)
    else:
        base = played.fired + taken_over
        assert any(recoveries - d == base for d in deaths), (recoveries, played.fired, taken_over)


def _recorded_steps(log: Sequence[Event]) -> list[JsonValue]:
    """The names of the steps (``s<k>``) the log records a result or failure of."""
    return [
        field_of(e, "name")
        for e in log
        if e.kind in (EventKind.STEP_COMPLETED, EventKind.STEP_FAILED)
        and field_of(e, "call") == "step"
    ]


def _check_wakes(
    log: Sequence[Event],
    written_at: dict[tuple[str, int], datetime],
    killed_at: datetime | None,
) -> None:
    """No timer or timeout was answered before its wake time (by the virtual clock when
    the answer was durable; an answer whose writer died before it heard back was durable
    at the death)."""
    for resumed in log:
        if resumed.kind != EventKind.EXECUTION_RESUMED:
            continue
        answer = field_of(resumed, "answer")
        assert isinstance(answer, dict)
        if answer["kind"] not in ("timer", "timeout"):
            continue
        park = log[field_of(resumed, "park")]  # type: ignore[index]
        assert park.kind == EventKind.EXECUTION_SUSPENDED
        waits = field_of(park, "waits")
        assert isinstance(waits, list)
        (wait,) = [
            w for w in waits
            if isinstance(w, dict) and w["position"] == field_of(resumed, "position")
        ]
        wake_at = datetime.fromisoformat(str(wait["wake_at"]))
        durable = written_at.get((resumed.execution_id, resumed.sequence), killed_at)
        assert durable is not None, f"no durable hook for {resumed}"
        assert durable >= wake_at, (resumed, wait)

