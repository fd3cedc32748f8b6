"""A token taken and nothing written after it: a run of this process fenced out by a
rival that died between its token and its record (a cancel cut short by a process death)
is carried on by this process once the log has stayed so for QUIET_RIVAL_AFTER seconds;
a rival that writes keeps what it wrote."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from loom_runtime import Context, Handle
from loom_runtime.app import QUIET_RIVAL_AFTER
from loom_runtime.records import cancelled, recovered
from store_probes import Wired, kinds, wired

from loom_core import EventKind, JsonValue


class Gate:
    """A step that waits until the test lets it return, and says when it is entered."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def step(self) -> str:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        return "charged"


async def turns_until(event: asyncio.Event) -> None:
    """Let the loop turn until ``event`` is set (a run in a step holds drain() back);
    fail, rather than hang, if it is not within a thousand turns (all on memory)."""
    for _ in range(1000):
        if event.is_set():
            return
        await asyncio.sleep(0)
    raise AssertionError("not set within 1000 turns of the loop")


async def fenced_out_quietly(w: Wired, gate: Gate) -> tuple[Handle[JsonValue], int]:
    """Start ``charges`` (one step through ``gate``) as ``c``; while its step runs, a
    rival takes a token, and the step returns: the run's write is refused and it stops.
    The handle, and the rival's token (for a rival that lives to write)."""

    async def charges(ctx: Context) -> str:
        return await ctx.step(gate.step, name="charge")

    w.app.workflow(name="charges")(charges)
    handle = await w.app.start("charges", id="c")
    await gate.entered.wait()
    token = await w.base.events.acquire_fence("c")
    gate.release.set()
    await w.app.drain()
    return handle, token


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_run_fenced_out_by_a_token_nothing_follows_is_carried_on_after_the_wait(
    backend: str, tmp_path: Path
) -> None:
    gate = Gate()
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"
    async with wired(url) as w:
        # A canceller in another process takes its token, then dies before its record.
        handle, _ = await fenced_out_quietly(w, gate)
        assert await kinds(w.base.events, "c") == [EventKind.EXECUTION_STARTED]
        assert w.app.stranded == frozenset()  # not a store failure's
        await w.clock.advance(QUIET_RIVAL_AFTER - 1)
        await w.app.drain()
        assert await kinds(w.base.events, "c") == [EventKind.EXECUTION_STARTED]
        await w.clock.advance(1)
        assert await handle.result(timeout=5) == "charged"
        assert await kinds(w.base.events, "c") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_RECOVERED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_COMPLETED,
        ]
        recovered = (await w.base.events.read("c"))[1]
        assert recovered.payload["carried_on"] is True  # type: ignore[index,call-overload]
        assert gate.calls == 2  # its result was never recorded: at least once
        assert w.app.stranded == frozenset()


async def test_a_rival_that_writes_under_its_token_keeps_the_execution() -> None:
    gate = Gate()
    async with wired() as w:
        _, token = await fenced_out_quietly(w, gate)
        # The rival lives: its record lands within the wait.
        await w.base.events.append(
            "c", [cancelled("by the rival", "n2")], expected_sequence=1, fence=token
        )
        await w.clock.advance(QUIET_RIVAL_AFTER * 2)
        await w.app.drain()
        assert await kinds(w.base.events, "c") == [
            EventKind.EXECUTION_STARTED, EventKind.EXECUTION_CANCELLED
        ]
        assert gate.calls == 1


async def test_a_rival_that_writes_and_runs_on_keeps_the_execution() -> None:
    gate = Gate()
    async with wired() as w:
        _, token = await fenced_out_quietly(w, gate)
        # Another node's takeover: its EXECUTION_RECOVERED lands, and its run goes on.
        await w.base.events.append(
            "c", [recovered("n2", token, "")], expected_sequence=1, fence=token
        )
        await w.clock.advance(QUIET_RIVAL_AFTER * 2)
        await w.app.drain()
        assert await kinds(w.base.events, "c") == [
            EventKind.EXECUTION_STARTED, EventKind.EXECUTION_RECOVERED
        ]
        assert (await w.app.inspect("c")).node == "n2"
        assert gate.calls == 1


async def test_a_log_deleted_under_a_run_stops_it() -> None:
    gate = Gate()
    async with wired() as w:

        async def charges(ctx: Context) -> str:
            return await ctx.step(gate.step, name="charge")

        w.app.workflow(name="charges")(charges)
        await w.app.start("charges", id="c")
        await gate.entered.wait()
        await w.base.events.delete_execution("c")
        gate.release.set()
        # The run's write meets a log that is gone: it stops. (A guard, not a measure:
        # such a run used to retry its write for ever.)
        async with asyncio.timeout(60):
            await w.app.drain()
        assert await w.base.events.head("c") == 0


async def test_each_carry_on_after_a_quiet_rival_waits_twice_as_long_as_the_one_before(
) -> None:
    gate = Gate()
    async with wired() as w:
        await fenced_out_quietly(w, gate)
        gate.entered.clear()
        gate.release.clear()
        await w.clock.advance(QUIET_RIVAL_AFTER)
        await turns_until(gate.entered)  # carried on: its replay runs the step again
        await w.base.events.acquire_fence("c")  # and a quiet rival again
        gate.release.set()
        await w.app.drain()
        await w.clock.advance(2 * QUIET_RIVAL_AFTER - 1)
        await w.app.drain()
        assert (await kinds(w.base.events, "c")).count(EventKind.EXECUTION_RECOVERED) == 1
        await w.clock.advance(1)
        assert await w.app.get("c").result(timeout=5) == "charged"
        assert (await kinds(w.base.events, "c")).count(EventKind.EXECUTION_RECOVERED) == 2
