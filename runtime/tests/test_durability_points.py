"""When a run's records become durable: a step's result travels with the run's next write
(the next step, a park, the end), and nothing a step depends on is left unwritten when
the step runs."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from loom_runtime import Context, Loom
from loom_runtime.testing import VirtualClock, check_replay, crash_at
from store_probes import ProbedEventStore

from loom_core import Event, EventStore, NewEvent, Storage, open_storage
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator


@asynccontextmanager
async def probed(inner: type[EventStoreDecorator] | None = None) -> AsyncIterator[
    tuple[Loom, ProbedEventStore]
]:
    base = await open_storage("memory://")
    events: EventStore = base.events if inner is None else inner(base.events)
    probe = ProbedEventStore(events)
    storage = Storage(probe, base.timers, base.leases, url=base.url, on_close=base.close)
    app = Loom(storage, node="n1", clock=VirtualClock(), random=random.Random(3),
               timers=False, recover=False)
    try:
        async with app:
            yield app, probe
    finally:
        await storage.close()


def appended(probe: ProbedEventStore, execution_id: str) -> list[tuple[str, ...]]:
    return [c.kinds for c in probe.of("append") if c.execution_id == execution_id]


async def answer() -> int:
    return 42


async def test_a_one_step_workflow_writes_its_step_with_its_end() -> None:
    async with probed() as (app, probe):

        @app.workflow(name="one")
        async def one(ctx: Context) -> int:
            return await ctx.step(answer) + 1

        assert await (await app.start(one, id="e1")).result(timeout=5) == 43
        assert appended(probe, "e1") == [
            ("EXECUTION_STARTED",),
            ("STEP_COMPLETED", "EXECUTION_COMPLETED"),
        ]
        assert await check_replay(app, ["e1"]) == ["e1"]


async def test_each_step_is_durable_before_the_next_one_runs() -> None:
    async with probed() as (app, probe):
        seen: list[list[str]] = []

        async def look() -> int:
            log = await app.storage.events.read("e2")
            seen.append([str(e.payload.get("name")) for e in log  # type: ignore[union-attr]
                         if e.kind == "STEP_COMPLETED"])
            return len(seen)

        @app.workflow(name="three")
        async def three(ctx: Context) -> int:
            total = 0
            for index in range(3):
                total += await ctx.step(look, name=f"look-{index}")
            return total

        assert await (await app.start(three, id="e2")).result(timeout=5) == 6
        assert seen == [[], ["look-0"], ["look-0", "look-1"]]
        assert appended(probe, "e2") == [
            ("EXECUTION_STARTED",),
            ("STEP_COMPLETED",),
            ("STEP_COMPLETED",),
            ("STEP_COMPLETED", "EXECUTION_COMPLETED"),
        ]


async def test_a_value_the_body_drew_is_durable_before_a_step_uses_it() -> None:
    # An idempotency key drawn with ctx.uuid() and handed to a step must be the one a
    # replay draws: it is written before the step runs, not with the step's result.
    async with probed() as (app, probe):
        recorded_when_charged: list[list[object]] = []

        async def charge(key: uuid.UUID) -> str:
            log = await app.storage.events.read("e3")
            recorded_when_charged.append(
                [e.payload.get("result") for e in log  # type: ignore[union-attr]
                 if e.kind == "STEP_COMPLETED"]
            )
            return f"charged under {key}"

        @app.workflow(name="pay")
        async def pay(ctx: Context) -> str:
            key = ctx.uuid()
            return await ctx.step(charge, key)

        result = await (await app.start(pay, id="e3")).result(timeout=5)
        key = result.removeprefix("charged under ")
        assert recorded_when_charged == [[key]]
        assert appended(probe, "e3") == [
            ("EXECUTION_STARTED",),
            ("STEP_COMPLETED",),
            ("STEP_COMPLETED", "EXECUTION_COMPLETED"),
        ]


class GatedEventStore(EventStoreDecorator):
    """Holds the first append of a lone STEP_COMPLETED until ``gate`` is set; ``entered``
    says it is held."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        if not self.entered.is_set() and [e.kind for e in events] == ["STEP_COMPLETED"]:
            self.entered.set()
            await self.gate.wait()
        return await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )

    decisions = Decisions(
        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
        append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
    )


async def test_a_result_recorded_while_an_earlier_write_is_in_flight_is_not_lost() -> None:
    # Branch 2 writes step b's result (held in the store) before step c; meanwhile branch
    # 1's step a returns. The held write must not take a's record with it when it lands.
    async with probed(GatedEventStore) as (app, probe):
        gated = probe.inner
        assert isinstance(gated, GatedEventStore)
        release_a = asyncio.Event()

        async def a() -> str:
            await release_a.wait()
            return "a"

        async def b() -> str:
            return "b"

        async def c() -> str:
            return "c"

        @app.workflow(name="fan")
        async def fan(ctx: Context) -> list[str]:
            async def b_then_c() -> str:
                return await ctx.step(b, name="b") + await ctx.step(c, name="c")

            first, second = await ctx.gather(ctx.step(a, name="a"), b_then_c())
            return [first, second]

        handle = await app.start(fan, id="e4")
        await gated.entered.wait()
        release_a.set()
        for _ in range(50):  # let step a return and record; the write stays held
            await asyncio.sleep(0)
        gated.gate.set()
        assert await handle.result(timeout=5) == ["a", "bc"]
        log = await app.storage.events.read("e4")
        names = sorted(str(e.payload.get("name")) for e in log  # type: ignore[union-attr]
                       if e.kind == "STEP_COMPLETED")
        assert names == ["a", "b", "c"]
        assert await check_replay(app, ["e4"]) == ["e4"]


async def test_a_crash_after_a_step_fires_only_once_its_record_is_durable() -> None:
    # recover() after crash.fired must find the step recorded, however slow the store.
    async with probed(GatedEventStore) as (app, probe):
        gated = probe.inner
        assert isinstance(gated, GatedEventStore)
        ran: list[str] = []

        async def reserve() -> str:
            ran.append("reserve")
            return "reserved"

        @app.workflow(name="crashy")
        async def crashy(ctx: Context) -> str:
            return await ctx.step(reserve, name="reserve")

        crash = crash_at(app, step="reserve", when="after", execution_id="e5")
        handle = await app.start(crashy, id="e5")
        await gated.entered.wait()
        for _ in range(50):
            await asyncio.sleep(0)
        assert not crash.fired.is_set(), "the crash fired while the record was not durable"
        gated.gate.set()
        await crash.fired.wait()
        assert [e.kind for e in await app.storage.events.read("e5")] == [
            "EXECUTION_STARTED", "STEP_COMPLETED"
        ]
        assert [h.execution_id for h in await app.recover()] == ["e5"]
        assert await handle.result(timeout=5) == "reserved"
        assert ran == ["reserve"]
