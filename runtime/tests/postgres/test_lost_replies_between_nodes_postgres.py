"""A write whose reply was lost (WriteOutcomeUnknownError) on one node, while another node
wrote in its place, on PostgreSQL: the app that lost the reply carries the execution on
only if its own write may still land. When the log already shows another node's answer to
the park, or another node's start of the id, it takes no token: one would fence out that
node's run in the middle of a step and run the step again here, on two nodes at once.

The lost reply is the probe's: the write never reaches the store, and the caller is told
its outcome is unknown, as when a connection drops after the write was sent.
"""

from __future__ import annotations

import asyncio

import pytest
from loom_conformance.postgres import PostgresServer, loom_postgres_server
from loom_runtime import Context
from loom_runtime.app import CARRY_ON_AFTER
from store_probes import Wired, kinds, wired

from loom_core import EventKind, WriteOutcomeUnknownError

__all__ = ["loom_postgres_server"]  # the session's server, a fixture


class Gate:
    """A step that waits until the test lets it return; counts how often it began."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def step(self) -> str:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        return "shipped"


async def carry_on_due(node: Wired) -> None:
    """Move ``node``'s clock past its first carry-on and wait until that has run."""
    await asyncio.sleep(0)  # the carry-on task starts its wait on the clock
    await node.clock.advance(CARRY_ON_AFTER)
    carrying = node.app._carrying_on
    if carrying is not None:
        await carrying


async def b_keeps_its_run(a: Wired, b: Wired, gate: Gate, *, parked: bool) -> None:
    """Node b's run is in the step; node a's carry-on of "x" comes due: it takes no token,
    b's run finishes, and the step ran once."""
    await gate.entered.wait()
    await carry_on_due(a)
    assert a.app.stranded == frozenset()
    assert EventKind.EXECUTION_RECOVERED not in await kinds(b.base.events, "x")
    gate.release.set()
    assert await b.app.get("x").result(timeout=10) == "shipped"
    assert gate.calls == 1
    waits = [EventKind.EXECUTION_SUSPENDED, EventKind.EXECUTION_RESUMED] if parked else []
    assert await kinds(b.base.events, "x") == [
        EventKind.EXECUTION_STARTED,
        *waits,
        EventKind.STEP_COMPLETED,
        EventKind.EXECUTION_COMPLETED,
    ]

async def test_an_answer_whose_reply_was_lost_leaves_the_run_of_the_node_that_answered(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_lost")
    gate = Gate()

    async def ships(ctx: Context) -> str:
        await ctx.sleep(3600)
        return await ctx.step(gate.step, name="ship")

    async with wired(url, node="a") as a, wired(url, node="b") as b:
        for node in (a, b):
            node.app.workflow(name="ships")(ships)
        await a.app.start("ships", id="x")
        await a.app.drain()
        park = (await a.app.inspect("x")).park
        assert park is not None

        async def lost(execution_id: str) -> None:
            raise WriteOutcomeUnknownError("acquire_fence_if", execution_id, "the test lost it")

        a.probe.before_acquire = lost
        with pytest.raises(WriteOutcomeUnknownError):
            await a.app.resume("x", fence_if_parked_at=park.sequence)
        a.probe.before_acquire = None
        assert a.app.stranded == {"x"}
        # Node b answers the park meanwhile, and its run is in the step.
        await b.app.resume("x", fence_if_parked_at=park.sequence)
        await b_keeps_its_run(a, b, gate, parked=True)


async def test_a_start_whose_reply_was_lost_leaves_the_run_of_the_node_that_started_it(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_lost")
    gate = Gate()

    async def ships(ctx: Context) -> str:
        return await ctx.step(gate.step, name="ship")

    async with wired(url, node="a") as a, wired(url, node="b") as b:
        for node in (a, b):
            node.app.workflow(name="ships")(ships)

        async def lost(execution_id: str, written: tuple[str, ...]) -> None:
            if EventKind.EXECUTION_STARTED in written:
                raise WriteOutcomeUnknownError("append", execution_id, "the test lost it")

        a.probe.before_append = lost
        with pytest.raises(WriteOutcomeUnknownError):
            await a.app.start("ships", id="x")
        a.probe.before_append = None
        assert a.app.stranded == {"x"}
        # The caller retried on node b, whose start landed and whose run is in the step.
        await b.app.start("ships", id="x", if_exists="attach")
        await b_keeps_its_run(a, b, gate, parked=False)


async def test_a_park_whose_reply_was_lost_leaves_the_run_of_the_node_that_answered_it(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_lost")
    gate = Gate()

    async def ships(ctx: Context) -> str:
        await ctx.sleep(3600)
        return await ctx.step(gate.step, name="ship")

    async with wired(url, node="a") as a, wired(url, node="b") as b:
        for node in (a, b):
            node.app.workflow(name="ships")(ships)

        async def lost(execution_id: str, written: tuple[str, ...]) -> None:
            if EventKind.EXECUTION_SUSPENDED in written:
                a.probe.after_append = None
                raise WriteOutcomeUnknownError("append", execution_id, "the test lost it")

        a.probe.after_append = lost  # the park lands; node a's run is not told so
        await a.app.start("ships", id="x")
        await a.app.drain()
        assert a.app.stranded == {"x"}
        park = (await b.app.inspect("x")).park
        assert park is not None
        # Node b answers the park that landed, and its run is in the step.
        await b.app.resume("x", fence_if_parked_at=park.sequence)
        await b_keeps_its_run(a, b, gate, parked=True)
