"""``ctx.receive_any``: the first message on any of several topics, exactly once, with the
topic it came on; the others stay in the inbox."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from loom_runtime import (
    Context,
    InvalidDurationError,
    Loom,
    Received,
    ReplayDivergedError,
)
from loom_runtime.records import Wait
from loom_runtime.testing import VirtualClock, check_replay, crash_at

from loom_core import EventKind, InvalidInputError, JsonValue, Storage, open_storage


async def consumed(app: Loom, execution_id: str) -> list[object]:
    return [
        e.payload
        for e in await app.storage.events.read(execution_id)
        if e.kind == EventKind.MESSAGE_CONSUMED
    ]


async def test_a_parked_receive_any_is_woken_by_a_message_on_any_of_its_topics(
    app: Loom,
) -> None:
    @app.workflow()
    async def approval(ctx: Context) -> object:
        got = await ctx.receive_any("approve", "reject")
        assert got is not None
        topic, value = got
        return [topic, value]

    handle = await app.start(approval, id="a")
    await app.drain()
    assert await handle.status() == "suspended"
    await app.send("a", "reject", {"by": "ann"})
    assert await handle.result(timeout=5) == ["reject", {"by": "ann"}]
    log = await app.storage.events.read("a")
    park = next(e for e in log if e.kind == EventKind.EXECUTION_SUSPENDED)
    assert park.payload["waits"][0]["topics"] == ["approve", "reject"]  # type: ignore[index,call-overload]
    taken = next(e for e in log if e.kind == EventKind.MESSAGE_CONSUMED)
    assert taken.payload["topic"] == "reject"  # type: ignore[index,call-overload]
    assert taken.payload["call"] == "receive_any"  # type: ignore[index,call-overload]
    # One append: the message and the resume it answers.
    assert log[taken.sequence + 1].kind == EventKind.EXECUTION_RESUMED
    assert log[taken.sequence + 1].fence == taken.fence


async def test_the_oldest_message_wins_and_the_others_stay_for_a_later_receive(
    app: Loom,
) -> None:
    gate = asyncio.Event()

    async def wait_gate() -> None:
        await gate.wait()

    @app.workflow()
    async def first_then_rest(ctx: Context) -> object:
        await ctx.step(wait_gate)
        first = await ctx.receive_any("a", "b")
        second = await ctx.receive_any("a", "b")
        other = await ctx.receive("c")
        return [first, second, other]

    handle = await app.start(first_then_rest, id="o")
    await app.send("o", "c", 0)
    await app.send("o", "b", 1)
    await app.send("o", "a", 2)
    gate.set()
    result = await handle.result(timeout=5)
    assert result == [["b", 1], ["a", 2], 0]
    kinds = [e.kind for e in await app.storage.events.read("o")]
    assert EventKind.EXECUTION_SUSPENDED not in kinds  # all three were already there


async def test_a_message_on_another_topic_does_not_wake_it(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def choosy(ctx: Context) -> object:
        return await ctx.receive_any("yes", "no")

    handle = await app.start(choosy, id="c")
    await app.drain()
    await app.send("c", "maybe", 1)
    await clock.advance(3600)  # the timer service polls; its row has nothing to answer
    await app.drain()
    assert await handle.status() == "suspended"
    await app.send("c", "no", 2)
    assert await handle.result(timeout=5) == ["no", 2]
    assert [p["topic"] for p in await consumed(app, "c")] == ["no"]  # type: ignore[index]


async def test_a_timeout_gives_none_and_a_later_message_stays_unconsumed(
    app: Loom, clock: VirtualClock
) -> None:
    @app.workflow()
    async def patient(ctx: Context) -> object:
        return await ctx.receive_any("approve", "reject", timeout=60)

    handle = await app.start(patient, id="t")
    await app.drain()
    await clock.advance(60)
    assert await handle.result(timeout=5) is None
    await app.send("t", "approve", "late")
    assert await consumed(app, "t") == []
    assert await check_replay(app, ["t"]) == ["t"]


async def test_a_message_whose_value_is_none_is_told_from_a_timeout(app: Loom) -> None:
    @app.workflow()
    async def bare(ctx: Context) -> object:
        got = await ctx.receive_any("ping", "stop", timeout=60)
        return None if got is None else list(got)

    handle = await app.start(bare, id="n")
    await app.drain()
    await app.send("n", "stop")  # the value defaults to None
    assert await handle.result(timeout=5) == ["stop", None]
    assert await check_replay(app, ["n"]) == ["n"]


async def test_a_replay_serves_the_recorded_topic_and_value(app: Loom) -> None:
    ran: list[object] = []

    async def record(got: object) -> None:
        ran.append(got)

    @app.workflow()
    async def crashy(ctx: Context) -> object:
        got = await ctx.receive_any("approve", "reject")
        assert isinstance(got, Received)
        await ctx.step(record, [got.topic, got.value])
        return [got.topic, got.value]

    crash_at(app, step="record", when="before")
    handle = await app.start(crashy, id="r")
    await app.drain()
    await app.send("r", "approve", 7)
    await app.drain()
    assert await handle.status() == "running"  # the crash left it there, as a death would
    await app.recover()
    assert await handle.result(timeout=5) == ["approve", 7]
    assert ran == [["approve", 7]]
    assert len(await consumed(app, "r")) == 1


async def _parked_on_receive_any(storage: Storage) -> int:
    old = Loom(storage, node="n", clock=VirtualClock(), random=random.Random(1), recover=False)

    @old.workflow(name="decide")
    async def decide(ctx: Context) -> object:
        return await ctx.receive_any("approve", "reject")

    async with old:
        await old.start(decide, id="d")
        await old.drain()
        view = await old.inspect("d")
        assert view.park is not None
        return view.park.sequence


async def _resumed_with(storage: Storage, body: object) -> tuple[Loom, list[BaseException]]:
    errors: list[BaseException] = []
    new = Loom(storage, node="n", clock=VirtualClock(), random=random.Random(1), recover=False,
               on_error=errors.append)
    new.workflow(name="decide")(body)  # type: ignore[type-var]
    await new.__aenter__()
    return new, errors


async def test_the_same_topics_in_another_order_match_the_park() -> None:
    async def reordered(ctx: Context) -> object:
        got = await ctx.receive_any("reject", "approve")
        return None if got is None else list(got)

    async with open_storage("memory://") as storage:
        await _parked_on_receive_any(storage)
        new, errors = await _resumed_with(storage, reordered)
        try:
            await new.send("d", "approve", True)
            assert await new.get("d").result(timeout=5) == ["approve", True]
            assert errors == []
        finally:
            await new.__aexit__(None, None, None)


@pytest.mark.parametrize(
    ("attempted", "text"),
    [
        ("receive", "receive('approve')"),
        ("fewer", "receive_any('approve')"),
        ("more", "receive_any('approve', 'reject', 'hold')"),
    ],
)
async def test_changed_topics_under_a_park_diverge_and_append_nothing(
    attempted: str, text: str
) -> None:
    async def changed(ctx: Context) -> object:
        if attempted == "receive":
            return await ctx.receive("approve")
        if attempted == "fewer":
            return await ctx.receive_any("approve")
        return await ctx.receive_any("approve", "reject", "hold")

    async with open_storage("memory://") as storage:
        park_seq = await _parked_on_receive_any(storage)
        before = list(await storage.events.read("d"))
        new, _ = await _resumed_with(storage, changed)
        try:
            await new.send("d", "approve", 1)  # stored; its delivery is refused
            with pytest.raises(ReplayDivergedError) as caught:
                await new.resume("d", fence_if_parked_at=park_seq)
            assert caught.value.recorded is not None
            assert caught.value.recorded.startswith("receive_any('approve', 'reject')")
            assert caught.value.attempted is not None
            assert caught.value.attempted.startswith(text)
            # Neither the delivery nor the resume answered the park: the log is untouched
            # and the message waits in the inbox for the fixed code.
            assert list(await storage.events.read("d")) == before
            assert (await new.inspect("d")).status == "suspended"
            assert len(await new.inbox.messages("d")) == 1
        finally:
            await new.__aexit__(None, None, None)


async def test_inside_gather_beside_a_sleep(app: Loom, clock: VirtualClock) -> None:
    @app.workflow()
    async def both(ctx: Context) -> object:
        got, _ = await ctx.gather(ctx.receive_any("x", "y"), ctx.sleep(10))
        return None if got is None else list(got)

    handle = await app.start(both, id="g")
    await app.drain()
    await app.send("g", "y", "why")
    await app.drain()
    assert await handle.status() == "suspended"  # the sleep still waits
    await clock.advance(10)
    assert await handle.result(timeout=5) == ["y", "why"]
    assert await check_replay(app, ["g"]) == ["g"]


async def test_check_replay_reaches_a_parked_receive_any(app: Loom) -> None:
    @app.workflow()
    async def waiting(ctx: Context) -> object:
        return await ctx.receive_any("approve", "reject")

    await app.start(waiting, id="p")
    await app.drain()
    await app.send("p", "elsewhere", 1)
    assert await check_replay(app, ["p"]) == ["p"]


@pytest.mark.parametrize(
    ("args", "wait", "error", "says"),
    [
        ((), None, InvalidInputError, "at least one topic"),
        ((["approve", "reject"],), None, InvalidInputError, "its own argument"),
        (("approve", "approve"), None, InvalidInputError, "more than once"),
        (("approve", ""), None, InvalidInputError, "non-empty str"),
        (("approve", 3), None, InvalidInputError, "non-empty str"),
        (("approve", "re\x00ject"), None, InvalidInputError, "U+0000"),
        (("approve",), -1, InvalidDurationError, "receive_any(timeout=...)"),
        (("approve",), math.inf, InvalidDurationError, "leave timeout= out to wait without end"),
    ],
)
async def test_bad_arguments_are_refused_and_nothing_is_appended(
    app: Loom, args: tuple[object, ...], wait: float | None, error: type[Exception], says: str
) -> None:
    @app.workflow()
    async def bad(ctx: Context) -> object:
        try:
            await ctx.receive_any(*args, timeout=wait)  # type: ignore[arg-type]
        except error as exc:
            return str(exc)
        return "accepted"

    handle = await app.start(bad, id="b")
    assert says in str(await handle.result(timeout=5))
    kinds = [e.kind for e in await app.storage.events.read("b")]
    assert kinds == [EventKind.EXECUTION_STARTED, EventKind.EXECUTION_COMPLETED]


def test_a_wait_reads_back_what_it_wrote_and_a_receive_keeps_its_old_form() -> None:
    any_wait = Wait((2,), "receive_any", None, ("a", "b"), "x.py:1")
    assert any_wait.to_json()["topics"] == ["a", "b"]
    assert Wait.from_json(any_wait.to_json()) == any_wait
    one = Wait((1,), "receive", None, ("a",), "x.py:1")
    assert one.to_json() == {"position": [1], "call": "receive", "topic": "a", "site": "x.py:1"}
    assert Wait.from_json(one.to_json()) == one
    broken: list[JsonValue] = [[], ["a", 1], "ab", None]
    for topics in broken:
        with pytest.raises(ValueError, match="lists its topics"):
            Wait.from_json({"position": [1], "call": "receive_any", "topics": topics})
