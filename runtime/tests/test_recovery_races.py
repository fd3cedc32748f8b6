"""Recovery beside the runs of its own process: ``recover()`` takes over only what no run in
this process drives or is about to drive.

An execution's first write (a start, a successor's start, an answer to a park) is durable
before its writer hears back, so a recovery scanning the log at that moment finds it
running under this node with no run registered for it yet. Taking it over would drive the
body twice in one process (a step run by both runs). Each test holds the writer in that
window, runs a recovery there, then lets the writer go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal

import pytest
from loom_runtime import Context
from loom_runtime.records import started
from loom_runtime.testing import crash_at
from store_probes import Wired, kinds, wired

from loom_core import EventKind, ExecutionAlreadyExistsError, NewEvent


def hold_after(
    w: Wired, execution_id: str, kind: str
) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the append of ``kind`` to ``execution_id`` once it is written: ``held`` is set
    then, and the writer goes on when the test sets ``release``."""
    held, release = asyncio.Event(), asyncio.Event()

    async def after(written_to: str, written: tuple[str, ...]) -> None:
        if written_to == execution_id and kind in written and not held.is_set():
            held.set()
            await release.wait()

    w.probe.after_append = after
    return held, release


def counting(w: Wired) -> tuple[list[str], Callable[..., Awaitable[object]]]:
    """A workflow ``work`` (continuing as new once when given 0) whose one step records
    each time it runs."""
    ran: list[str] = []

    async def bump(execution_id: str) -> str:
        ran.append(execution_id)
        return execution_id

    async def work(ctx: Context, generation: int = 1) -> str:
        if generation == 0:
            ctx.continue_as_new(1)
        return await ctx.step(bump, ctx.execution_id)

    return ran, w.app.workflow(name="work")(work)


async def test_a_recovery_while_a_start_is_written_leaves_the_execution_to_its_starter() -> None:
    async with wired() as w:
        ran, work = counting(w)
        held, release = hold_after(w, "x", EventKind.EXECUTION_STARTED)
        start = asyncio.create_task(w.app.start(work, id="x"))
        await held.wait()
        w.probe.after_list = release.set  # recovery lists while the start is unanswered
        assert await w.app.recover() == []
        handle = await start
        assert await handle.result(timeout=5) == "x"
        assert ran == ["x"]
        assert EventKind.EXECUTION_RECOVERED not in await kinds(w.base.events, "x")
        assert w.errors == []


async def test_a_recovery_while_a_successor_is_created_leaves_it_to_the_run_that_made_it(
) -> None:
    async with wired() as w:
        ran, work = counting(w)
        held, release = hold_after(w, "x#1", EventKind.EXECUTION_STARTED)
        handle = await w.app.start(work, 0, id="x")
        await held.wait()
        w.probe.after_list = release.set
        assert await w.app.recover() == []
        assert await handle.result(timeout=5) == "x#1"
        assert ran == ["x#1"]
        assert EventKind.EXECUTION_RECOVERED not in await kinds(w.base.events, "x#1")
        assert w.errors == []


async def test_a_recovery_while_a_park_is_answered_leaves_the_execution_to_its_resumer(
) -> None:
    async with wired() as w:
        handle = await w.app.start("nap", id="x")
        await w.app.drain()
        park = (await handle.view()).park
        assert park is not None
        held, release = hold_after(w, "x", EventKind.EXECUTION_RESUMED)
        resume = asyncio.create_task(w.app.resume("x", fence_if_parked_at=park.sequence))
        await held.wait()
        w.probe.after_list = release.set
        assert await w.app.recover() == []
        await resume
        assert await handle.result(timeout=5) == "awake"
        assert EventKind.EXECUTION_RECOVERED not in await kinds(w.base.events, "x")
        assert w.errors == []


async def test_two_recoveries_at_once_take_an_execution_over_once() -> None:
    async with wired() as w:
        w.app.workflow(name="left")(_left_behind)
        # What a process of this node left when it died: started, never driven further.
        await w.base.events.append(
            "y", [_started_by(w.app.node)], expected_sequence=0, fence=0
        )
        held, release = hold_after(w, "y", EventKind.EXECUTION_RECOVERED)
        first = asyncio.create_task(w.app.recover())
        await held.wait()
        # The second lists while the first's takeover is written and unanswered.
        w.probe.after_list = release.set
        assert await w.app.recover() == []
        assert [h.execution_id for h in await first] == ["y"]
        await w.app.drain()
        log = await kinds(w.base.events, "y")
        assert log.count(EventKind.EXECUTION_RECOVERED) == 1
        assert log[-1] == EventKind.EXECUTION_COMPLETED
        assert w.errors == []


async def test_a_start_refused_for_an_existing_id_does_not_keep_recovery_from_it() -> None:
    async with wired() as w:
        w.app.workflow(name="left")(_left_behind)
        await w.base.events.append(
            "y", [_started_by(w.app.node)], expected_sequence=0, fence=0
        )
        attempted, release = asyncio.Event(), asyncio.Event()

        async def hold(execution_id: str, written: tuple[str, ...]) -> None:
            if execution_id == "y" and EventKind.EXECUTION_STARTED in written:
                attempted.set()
                await release.wait()

        w.probe.before_append = hold
        # The second start of an id (a restarted worker starting its work again) is in
        # flight when recovery lists the executions; recovery must wait for its answer.
        start = asyncio.create_task(w.app.start("left", id="y"))
        await attempted.wait()
        w.probe.after_list = release.set
        recovery = asyncio.create_task(w.app.recover())
        with pytest.raises(ExecutionAlreadyExistsError):
            await start
        assert [h.execution_id for h in await recovery] == ["y"]
        assert await w.app.get("y").result(timeout=5) == "recovered"
        assert w.errors == []


async def continued_until_a_crash(w: Wired, when: Literal["before", "after"]) -> list[str]:
    """Start ``work`` as ``x``, continuing as new once, and kill its run ``when`` the
    continuation is recorded; returns the list of steps run (empty so far)."""
    ran, work = counting(w)
    crash = crash_at(w.app, step="continue", when=when)
    await w.app.start(work, 0, id="x")
    await w.app.drain()
    assert crash.count == 1
    return ran


async def test_a_successor_whose_continuation_is_not_recorded_is_driven_once() -> None:
    # Died after creating the successor, before recording the continuation: both are
    # running, and the predecessor's replay continues again and takes the successor over.
    # Recovering the successor as well would drive it twice (its step ran twice).
    async with wired() as w:
        ran = await continued_until_a_crash(w, "before")
        assert await kinds(w.base.events, "x#1") == [EventKind.EXECUTION_STARTED]
        assert (await w.app.get("x").status(), await w.app.get("x#1").status()) == (
            "running",
            "running",
        )
        assert [h.execution_id for h in await w.app.recover()] == ["x"]
        assert await w.app.get("x").result(timeout=5) == "x#1"
        assert ran == ["x#1"]
        assert (await kinds(w.base.events, "x"))[-1] == EventKind.EXECUTION_CONTINUED
        assert w.errors == []


async def test_a_successor_whose_continuation_is_recorded_is_recovered() -> None:
    async with wired() as w:
        ran = await continued_until_a_crash(w, "after")
        assert await w.app.get("x").status() == "continued"
        assert ran == []
        assert [h.execution_id for h in await w.app.recover()] == ["x#1"]
        assert await w.app.get("x").result(timeout=5) == "x#1"
        assert ran == ["x#1"]
        assert w.errors == []


async def test_a_successor_whose_predecessor_was_cancelled_instead_is_cancelled() -> None:
    async with wired() as w:
        ran = await continued_until_a_crash(w, "before")
        assert await w.app.cancel("x", reason="operator") is True
        assert await w.app.recover() == []
        assert await w.app.get("x#1").status() == "cancelled"
        log = await w.base.events.read("x#1")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_CANCELLED,
        ]
        reason = log[-1].payload["reason"]  # type: ignore[index,call-overload]
        assert reason == "'x' ended cancelled without continuing as 'x#1'"
        assert ran == []
        assert w.errors == []


async def _left_behind(ctx: Context) -> str:
    return "recovered"


def _started_by(node: str) -> NewEvent:
    """What a start by ``node`` writes first (as a process that then died left it)."""
    return started("left", [], fingerprint="", node=node, root="y")
