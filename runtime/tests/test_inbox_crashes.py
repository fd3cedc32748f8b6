"""A sender that dies at any store call of ``app.send``, then a re-drive: the message is
delivered exactly once (one MESSAGE_CONSUMED and one EXECUTION_RESUMED), never twice and
never not at all once it was stored.

The sender is an actor of :class:`~loom_conformance.explorer.Interleaving`: every schedule
of it alone is one crash point (after 0, 1, 2, ... of its store calls), among them the two
that matter most: after its acquire and before the append of [MESSAGE_CONSUMED,
EXECUTION_RESUMED], and after that append, before the body ran on. What a restarted node
does follows (``recover()``, then a timer poll), after one of three triggers: the timer
row ``send`` left behind, a second send, or a resume by hand.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from loom_conformance.explorer import Interleaving, Played, every_interleaving
from loom_runtime import Context, Loom, ResumeRefusedError
from loom_runtime.testing import VirtualClock, check_replay

from loom_core import EventKind, FenceAcquired, Storage, open_storage

TOPIC: Final = "approve"
FIRST: Final = {"ok": "first"}
SECOND: Final = {"ok": "second"}


async def approval(ctx: Context) -> object:
    return await ctx.receive(TOPIC)


@dataclass(slots=True)
class Bench:
    base: Storage
    app: Loom
    interleaving: Interleaving
    plays: int = 0


@asynccontextmanager
async def bench(url: str) -> AsyncIterator[Bench]:
    base = await open_storage(url)
    interleaving = Interleaving()
    errors: list[BaseException] = []
    app = Loom(
        interleaving.storage(base), node="n1", clock=VirtualClock(), random=random.Random(3),
        on_error=errors.append, timers=False, recover=False,
    )
    app.workflow(name="approval")(approval)
    try:
        async with app:
            yield Bench(base, app, interleaving)
        assert errors == [], errors
    finally:
        await base.close()


def stored(played: Played) -> bool:
    """Whether the sender's message reached its inbox stream before the crash."""
    return any(c.method == "append" and c.execution_id.startswith("$") and c.written()
               for c in played.calls)


def answered(played: Played) -> bool:
    return any(c.method == "append" and not c.execution_id.startswith("$") and c.written()
               for c in played.calls)


async def redrive(b: Bench, execution_id: str, park: int, trigger: str, played: Played) -> None:
    app = b.app
    if trigger == "second send":
        await app.send(execution_id, TOPIC, SECOND)
    elif trigger == "resume by hand":
        if answered(played):
            with pytest.raises(ResumeRefusedError) as caught:  # answered: the body is due
                await app.resume(execution_id, fence_if_parked_at=park)
            assert caught.value.reason == "not-suspended"
        elif stored(played):
            await app.resume(execution_id, fence_if_parked_at=park)
        else:
            with pytest.raises(ResumeRefusedError) as caught:
                await app.resume(execution_id, fence_if_parked_at=park)
            assert caught.value.reason == "nothing-to-answer"
    await app.drain()
    # What the restarted node does: recover its own running executions, fire due rows.
    await app.recover()
    await app.drain()
    await app.timer_service.poll_once()
    await app.drain()


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"


@pytest.mark.parametrize("trigger", ["timer row", "second send", "resume by hand"])
async def test_a_sender_that_dies_at_any_point_is_re_driven_to_exactly_one_delivery(
    url: str, trigger: str
) -> None:
    async with bench(url) as b:
        crash_points: list[Played] = []

        async def play(word: str) -> Played:
            b.plays += 1
            execution_id = f"order-{b.plays}"
            await b.app.start("approval", id=execution_id)
            await b.app.drain()
            view = await b.app.inspect(execution_id)
            assert view.park is not None
            park = view.park.sequence

            async def send() -> None:
                await b.app.send(execution_id, TOPIC, FIRST)
                await b.app.drain()

            played = await b.interleaving.play(word, {"S": send})
            crash_points.append(played)
            await redrive(b, execution_id, park, trigger, played)
            await check_delivered_once(b, execution_id, played, trigger)
            return played

        async for _ in every_interleaving(play):
            pass
        # Every crash point was played, the two that matter among them.
        calls = crash_points[-1].calls
        inbox = "$inbox:" + calls[0].execution_id
        assert crash_points[-1].crashed == frozenset()
        assert len(crash_points) == len(calls) + 1
        acquired = next(
            i for i, c in enumerate(calls)
            if c.method == "acquire_fence_if" and isinstance(c.result, FenceAcquired)
        )
        delivered = next(
            i for i, c in enumerate(calls) if c.method == "append" and c.execution_id != inbox
        )
        assert acquired < delivered
        between = crash_points[delivered]  # crashed before the append, after the acquire
        assert between.outcomes["S"].pending.startswith("append('order-")
        after = crash_points[delivered + 1]
        assert answered(after)
        assert after.crashed == {"S"}


async def check_delivered_once(
    b: Bench, execution_id: str, played: Played, trigger: str
) -> None:
    log = await b.base.events.read(execution_id)
    explain = played.explain() + "\n    log: " + ", ".join(e.kind for e in log)
    consumed = [e for e in log if e.kind == EventKind.MESSAGE_CONSUMED]
    resumed = [e for e in log if e.kind == EventKind.EXECUTION_RESUMED]
    view = await b.app.inspect(execution_id)
    if stored(played):
        expected: object = FIRST
    elif trigger == "second send":
        expected = SECOND
    else:
        # The message never became durable (the sender died before its send returned),
        # so there is nothing to deliver, and nothing was.
        assert (consumed, resumed, view.status) == ([], [], "suspended"), explain
        return
    assert len(consumed) == 1, explain
    assert len(resumed) == 1, explain
    assert isinstance(consumed[0].payload, dict)
    assert consumed[0].payload["value"] == expected, explain
    assert consumed[0].sequence + 1 == resumed[0].sequence  # one write, the two together
    assert view.status == "completed", explain
    assert view.result == expected, explain
    assert await b.base.timers.pending(execution_id) == ()
    assert await check_replay(b.app, [execution_id]) == [execution_id]
