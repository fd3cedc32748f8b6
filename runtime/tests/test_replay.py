"""Replay: every durable call is matched against the log by position, and a body that no
longer matches is refused with both sides named and nothing appended."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import pytest
from loom_runtime import Context, Loom, ReplayDivergedError, StepFailedError, WorkflowFailedError
from loom_runtime.testing import VirtualClock, check_replay

from loom_core import Storage, open_storage


async def reserve() -> str:
    return "reserved"


async def charge() -> str:
    return "charged"


async def ship() -> str:
    return "shipped"


async def order(ctx: Context) -> str:
    """The old body: reserve, charge, then a long sleep, then ship."""
    await ctx.step(reserve)
    await ctx.step(charge)
    await ctx.sleep(3600)
    return await ctx.step(ship)


async def parked_on_the_old_code(storage: Storage) -> tuple[int, list[object]]:
    """Run the old body until it parks."""
    old = Loom(storage, node="n", clock=VirtualClock(), random=random.Random(1), recover=False)
    old.workflow(name="order")(order)
    async with old:
        await old.start(order, id="o")
        await old.drain()
        view = await old.inspect("o")
        assert view.status == "suspended"
        assert view.park is not None
        return view.park.sequence, list(await storage.events.read("o"))


async def resume_with_new_code(
    storage: Storage, body: object, park_seq: int
) -> tuple[Loom, ReplayDivergedError]:
    """Resume the parked execution under ``body``: the resume is refused with the
    divergence its replay meets, before it answers the park."""
    new = Loom(storage, node="n", clock=VirtualClock(), random=random.Random(1), recover=False,
               on_error=lambda exc: None)
    new.workflow(name="order")(body)  # type: ignore[type-var]
    await new.__aenter__()
    try:
        with pytest.raises(ReplayDivergedError) as diverged:
            await new.resume("o", fence_if_parked_at=park_seq)
        await new.drain()
    except BaseException:
        await new.__aexit__(None, None, None)
        raise
    return new, diverged.value


async def renamed(ctx: Context) -> str:
    await ctx.step(reserve)
    await ctx.step(ship)  # was charge
    await ctx.sleep(3600)
    return await ctx.step(ship)


async def reordered(ctx: Context) -> str:
    await ctx.step(charge)
    await ctx.step(reserve)
    await ctx.sleep(3600)
    return await ctx.step(ship)


async def removed(ctx: Context) -> str:
    await ctx.step(reserve)
    await ctx.sleep(3600)  # a sleep where a step was
    return await ctx.step(ship)


async def fewer_calls(ctx: Context) -> str:
    await ctx.step(reserve)
    return "done early"  # returns while recorded calls remain


@pytest.mark.parametrize(
    ("body", "position", "recorded", "attempted"),
    [
        (renamed, "1", "step 'charge'", "step 'ship'"),
        (reordered, "0", "step 'reserve'", "step 'charge'"),
        (removed, "1", "step 'charge'", "sleep() at test_replay.py"),
        (fewer_calls, "1", "step 'charge'", "no call: the body returns"),
    ],
    ids=["renamed", "reordered", "removed", "returns-early"],
)
async def test_changed_code_under_a_parked_execution_diverges_and_appends_nothing(
    body: object, position: str, recorded: str, attempted: str
) -> None:
    async with open_storage("memory://") as storage:
        park_seq, before = await parked_on_the_old_code(storage)
        new, error = await resume_with_new_code(storage, body, park_seq)
        try:
            assert error.execution_id == "o"
            assert error.position == position
            assert error.recorded is not None
            assert error.recorded.startswith(recorded)
            assert error.attempted is not None
            assert error.attempted.startswith(attempted)
            assert "test_replay.py:" in error.recorded  # the recorded call site
            # The resume was refused before it answered the park: the log is untouched,
            # and the execution still parked, for the fixed code to resume.
            assert list(await storage.events.read("o")) == before
            assert (await new.inspect("o")).status == "suspended"
            assert "o" not in new.halted
        finally:
            await new.__aexit__(None, None, None)


async def test_a_resume_refused_for_diverging_code_is_made_by_the_fixed_code() -> None:
    """The execution stays where it was: the fixed code (here the old one, registered
    again) resumes it at the same park, and it finishes as it would have."""
    async with open_storage("memory://") as storage:
        park_seq, before = await parked_on_the_old_code(storage)
        new, _ = await resume_with_new_code(storage, renamed, park_seq)
        await new.__aexit__(None, None, None)
        fixed = Loom(storage, node="n", clock=VirtualClock(), recover=False)
        fixed.workflow(name="order")(order)
        async with fixed:
            await fixed.resume("o", fence_if_parked_at=park_seq)
            assert await fixed.get("o").result(timeout=5) == "shipped"
        log = list(await storage.events.read("o"))
        assert log[: len(before)] == before
        assert [e.kind for e in log[len(before):]] == [
            "EXECUTION_RESUMED", "STEP_COMPLETED", "EXECUTION_COMPLETED"
        ]


async def test_a_due_timer_of_diverging_code_leaves_the_park_and_reports_once() -> None:
    """The timer service's wake meets the divergence before it answers: on_error hears of
    it once, the row stays (the fixed code's node wakes it), the log is untouched."""
    async with open_storage("memory://") as storage:
        _, before = await parked_on_the_old_code(storage)
        errors: list[BaseException] = []
        clock = VirtualClock()
        new = Loom(storage, node="n", clock=clock, recover=False, on_error=errors.append)
        new.workflow(name="order")(renamed)
        async with new:
            await clock.advance(3600)
            await clock.advance(600)  # tried again after its backoff: not reported again
            assert [type(e) for e in errors] == [ReplayDivergedError]
            assert list(await storage.events.read("o")) == before
            assert len(await storage.timers.pending("o")) == 1
            assert (await new.inspect("o")).status == "suspended"


async def pay_by_card(ctx: Context) -> str:
    return await ctx.step(charge)


async def pay_by_invoice(ctx: Context) -> str:
    return await ctx.step(ship, name="invoice")


pay = pay_by_card  # the helper a body calls; a test rebinds it, as a deploy changes it


async def order_through_a_helper(ctx: Context) -> str:
    await ctx.step(reserve)
    await pay(ctx)
    await ctx.sleep(3600)
    return await ctx.step(ship)


async def test_a_changed_helper_of_the_bodys_package_refuses_the_answer_to_its_park(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The body is the same, the helper coroutine it calls is not: the digest covers the
    helper, so the resume replays first and is refused before it answers the park."""
    async with open_storage("memory://") as storage:
        old = Loom(storage, node="n", clock=VirtualClock(), recover=False)
        old.workflow(name="order")(order_through_a_helper)
        async with old:
            await old.start("order", id="o")
            await old.drain()
            park = (await old.inspect("o")).park
            assert park is not None
        before = list(await storage.events.read("o"))
        monkeypatch.setattr(f"{__name__}.pay", pay_by_invoice)
        new = Loom(storage, node="n", clock=VirtualClock(), recover=False)
        new.workflow(name="order")(order_through_a_helper)
        async with new:
            with pytest.raises(ReplayDivergedError) as diverged:
                await new.resume("o", fence_if_parked_at=park.sequence)
            assert diverged.value.recorded is not None
            assert diverged.value.recorded.startswith("step 'charge'")
            assert list(await storage.events.read("o")) == before
            assert (await new.inspect("o")).status == "suspended"


body_runs: list[str] = []


async def two_parks_through_a_helper(ctx: Context) -> str:
    body_runs.append(ctx.execution_id)
    await ctx.step(reserve)
    await ctx.sleep(3600)
    await pay(ctx)
    await ctx.sleep(3600)
    return await ctx.step(ship)


async def answer_as(storage: Storage, helper: Callable[[Context], Awaitable[str]],
                    monkeypatch: pytest.MonkeyPatch) -> ReplayDivergedError | None:
    """Answer o's park under the body with ``helper`` as its ``pay`` (one deploy of the
    code or another), and drain the run on from it; the divergence that refused the
    answer, if one did."""
    monkeypatch.setattr(f"{__name__}.pay", helper)
    app = Loom(storage, node="n", clock=VirtualClock(), recover=False)
    app.workflow(name="order")(two_parks_through_a_helper)
    async with app:
        park = (await app.inspect("o")).park
        assert park is not None
        try:
            await app.resume("o", fence_if_parked_at=park.sequence)
        except ReplayDivergedError as exc:
            return exc
        await app.drain()
    return None


async def start_parked(storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.pay", pay_by_card)
    app = Loom(storage, node="n", clock=VirtualClock(), recover=False)
    app.workflow(name="order")(two_parks_through_a_helper)
    async with app:
        await app.start("order", id="o")
        await app.drain()


async def test_a_rollback_is_refused_the_answer_to_a_park_the_new_code_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old code started the execution, the new code answered its first park and ran
    on (paying by invoice) to the second. The old code, deployed again, is not the code
    that drove it last: its answer to the second park replays first and is refused, for
    it pays by card where the log paid by invoice; before, it answered, and the run it
    started then diverged, after a write no one could take back."""
    async with open_storage("memory://") as storage:
        await start_parked(storage, monkeypatch)
        assert await answer_as(storage, pay_by_invoice, monkeypatch) is None
        before = list(await storage.events.read("o"))
        assert [e.kind for e in before].count("EXECUTION_SUSPENDED") == 2
        diverged = await answer_as(storage, pay_by_card, monkeypatch)
        assert diverged is not None
        assert diverged.recorded is not None
        assert diverged.recorded.startswith("step 'invoice'")
        assert list(await storage.events.read("o")) == before


async def test_the_code_that_answered_a_park_answers_the_next_without_a_replay_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer records the answering code's digest: once the new code has answered a
    park (after the replay that checks it), its next answer runs the body once, not a
    replay first and then the run."""
    async with open_storage("memory://") as storage:
        await start_parked(storage, monkeypatch)
        body_runs.clear()
        assert await answer_as(storage, pay_by_invoice, monkeypatch) is None
        assert len(body_runs) == 2  # the check's replay, then the run
        body_runs.clear()
        assert await answer_as(storage, pay_by_invoice, monkeypatch) is None
        assert len(body_runs) == 1
        log = await storage.events.read("o")
        assert log[-1].kind == "EXECUTION_COMPLETED"
        assert log[-1].payload == {"result": "shipped"}


async def test_patched_keeps_old_executions_on_the_old_path() -> None:
    versions: dict[str, bool] = {}

    async def parked(storage: Storage) -> None:
        old = Loom(storage, node="n", recover=False, clock=VirtualClock())

        @old.workflow(name="greet")
        async def greet(ctx: Context) -> str:
            await ctx.step(reserve)
            await ctx.sleep(10)
            return "old"

        async with old:
            await old.start(greet, id="old-run")
            await old.drain()

    async with open_storage("memory://") as storage:
        await parked(storage)
        new = Loom(storage, node="n", recover=False, clock=VirtualClock())

        @new.workflow(name="greet")
        async def greet(ctx: Context) -> str:
            await ctx.step(reserve)
            patched = ctx.patched("send-receipt")
            versions[ctx.execution_id] = patched
            if patched:
                await ctx.step(ship)
            await ctx.sleep(10)
            return "new" if patched else "old"

        async with new:
            view = await new.inspect("old-run")
            assert view.park is not None
            await new.resume("old-run", fence_if_parked_at=view.park.sequence)
            assert await new.get("old-run").result(timeout=5) == "old"
            fresh = await new.start(greet, id="new-run")
            await new.drain()
            fresh_view = await new.inspect("new-run")
            assert fresh_view.park is not None
            await new.resume("new-run", fence_if_parked_at=fresh_view.park.sequence)
            assert await fresh.result(timeout=5) == "new"
            assert versions == {"old-run": False, "new-run": True}
            assert await check_replay(new) == ["new-run", "old-run"]


async def test_a_patch_an_execution_lacks_stays_absent_for_the_rest_of_it() -> None:
    """One change guarded in two places by one patch name: an execution that recorded the
    first place with the old code takes the old path at the second too, though it reaches
    that one only under the new code (a half-new execution would charge stock it never
    reserved). Each new execution takes the new path at both."""
    code = {"version": 1}

    async def step_named(what: str) -> str:
        return what

    async def order(ctx: Context) -> list[str]:
        done = []
        if code["version"] == 2 and ctx.patched("reserve-first"):
            done.append(await ctx.step(step_named, "reserve"))
        await ctx.sleep(10)
        if code["version"] == 2 and ctx.patched("reserve-first"):
            done.append(await ctx.step(step_named, "charge the reserved stock"))
        else:
            done.append(await ctx.step(step_named, "charge"))
        return done

    async with open_storage("memory://") as storage:
        clock = VirtualClock()
        old = Loom(storage, node="n", clock=clock)
        old.workflow(name="order")(order)
        async with old:
            await old.start("order", id="old-run")
            await old.drain()
        code["version"] = 2
        new = Loom(storage, node="n", clock=clock)
        new.workflow(name="order")(order)
        async with new:
            await new.start("order", id="new-run")
            await new.drain()
            await clock.advance(10)
            assert await new.get("old-run").result(timeout=5) == ["charge"]
            assert await new.get("new-run").result(timeout=5) == [
                "reserve",
                "charge the reserved stock",
            ]
            assert await check_replay(new) == ["new-run", "old-run"]


async def test_gather_numbers_calls_in_issue_order_not_finish_order(app: Loom) -> None:
    release_first = asyncio.Event()

    async def slow() -> str:
        await release_first.wait()
        return "slow"

    async def fast() -> str:
        release_first.set()
        return "fast"

    async def branch(ctx: Context, name: str) -> list[str]:
        first = await ctx.step(slow if name == "a" else fast, name=f"{name}-1")
        second = await ctx.step(fast, name=f"{name}-2")
        return [first, second]

    @app.workflow()
    async def fan(ctx: Context) -> list[object]:
        one, two = await ctx.gather(ctx.step(slow), ctx.step(fast))
        left, right = await ctx.gather(branch(ctx, "a"), branch(ctx, "b"))
        return [one, two, left, right]

    handle = await app.start(fan, id="g")
    assert await handle.result(timeout=5) == ["slow", "fast", ["slow", "fast"], ["fast", "fast"]]
    positions = {
        tuple(e.payload["position"]): e.payload["name"]  # type: ignore[index,call-overload,arg-type]
        for e in await app.storage.events.read("g")
        if e.kind == "STEP_COMPLETED"
    }
    # The two direct steps took 0 and 1 when they were made; the gather itself is 2; the
    # second gather (3) numbers each branch's calls under (3, branch).
    assert positions == {
        (0,): "test_gather_numbers_calls_in_issue_order_not_finish_order.<locals>.slow",
        (1,): "test_gather_numbers_calls_in_issue_order_not_finish_order.<locals>.fast",
        (3, 0, 0): "a-1",
        (3, 0, 1): "a-2",
        (3, 1, 0): "b-1",
        (3, 1, 1): "b-2",
    }
    assert await check_replay(app) == ["g"]


async def test_recorded_values_replay_identically(app: Loom, clock: VirtualClock) -> None:
    seen: list[tuple[str, float, str]] = []

    @app.workflow()
    async def values(ctx: Context) -> list[object]:
        now, rnd, uid = ctx.now(), ctx.random(), ctx.uuid()
        seen.append((now.isoformat(), rnd, str(uid)))
        await ctx.sleep(5)
        return [now.isoformat(), rnd, str(uid)]

    result = await app.start(values, id="v")
    await app.drain()
    await clock.advance(5)
    out = await result.result(timeout=5)
    assert len(seen) == 2  # ran once live, once replayed after the resume
    assert seen[0] == seen[1]
    assert out == list(seen[0])


async def test_a_value_with_an_integer_past_64_bits_keeps_its_keys_in_order_on_replay(
    app: Loom, clock: VirtualClock
) -> None:
    async def stock() -> dict[str, int]:
        return {"zinc": 2**70, "iron": 1}

    reserved: list[list[str]] = []

    @app.workflow(name="reserve_all")
    async def reserve_all(ctx: Context, order: dict[str, int]) -> list[str]:
        names = [*order, *await ctx.step(stock)]
        reserved.append(names)
        await ctx.sleep(5)
        return names

    handle = await app.start(reserve_all, {"pears": -(2**65), "apples": 2}, id="r")
    await app.drain()
    await clock.advance(5)
    # Live, on the replay after the sleep, and in the result: the order they were given.
    order = ["pears", "apples", "zinc", "iron"]
    assert await handle.result(timeout=5) == order
    assert reserved == [order, order]
    assert await check_replay(app) == ["r"]
    assert reserved[-1] == order


async def test_a_body_that_changes_what_it_was_given_replays_as_it_ran(
    app: Loom, clock: VirtualClock
) -> None:
    """A body changes its argument, a step's result before that result is written (it is
    written with the run's next write), and a message; after a park, the run replayed in
    this process is served what the log holds, as a replay after a restart would be."""

    async def load() -> dict[str, list[str]]:
        return {"items": ["a"]}

    seen: list[tuple[str, list[str]]] = []

    @app.workflow(name="mutating")
    async def mutating(ctx: Context, order: dict[str, list[str]]) -> object:
        seen.append(("input", [*order["lines"]]))
        order["lines"].append("changed")
        loaded = await ctx.step(load)
        seen.append(("loaded", [*loaded["items"]]))
        loaded["items"].append("changed")  # before the result is written
        note = await ctx.receive("note")
        assert isinstance(note, dict)
        tags = note["tags"]
        assert isinstance(tags, list)
        seen.append(("note", [str(t) for t in tags]))
        tags.append("changed")
        await ctx.sleep(5)
        return [order, loaded, note]

    handle = await app.start(mutating, {"lines": ["l"]}, id="m")
    await app.send("m", "note", {"tags": ["t"]})
    await app.drain()
    await clock.advance(5)
    result = await handle.result(timeout=5)
    assert result == [
        {"lines": ["l", "changed"]},
        {"items": ["a", "changed"]},
        {"tags": ["t", "changed"]},
    ]
    # Every run, live or replayed, saw what the log holds, never an earlier run's changes.
    logged = {"input": ["l"], "loaded": ["a"], "note": ["t"]}
    assert [label for label, _ in seen].count("input") >= 2  # replayed at least once
    assert [(label, logged[label]) for label, _ in seen] == seen
    log = await app.storage.events.read("m")
    step = next(e for e in log if e.payload.get("call") == "step")  # type: ignore[union-attr]
    assert step.payload["result"] == {"items": ["a"]}  # type: ignore[index,call-overload]
    assert await check_replay(app, ["m"]) == ["m"]


async def test_a_branch_that_raises_a_cancellation_of_its_own_fails_in_argument_order(
    app: Loom,
) -> None:
    """A gather raises the first failure in argument order, a CancelledError a branch
    raised of its own (not its task cancelled) among them, with its message: it is a
    failure like any other."""

    async def echo(value: int) -> int:
        return value

    async def fails(ctx: Context) -> None:
        await ctx.step(echo, 1)
        raise ValueError("first in argument order")

    async def gives_up(ctx: Context) -> None:
        await ctx.step(echo, 2)
        raise asyncio.CancelledError("mine")

    @app.workflow()
    async def caught(ctx: Context) -> str:
        try:
            await ctx.gather(fails(ctx), gives_up(ctx))
        except ValueError as exc:
            return f"caught {exc}"
        return "nothing raised"

    @app.workflow()
    async def uncaught(ctx: Context) -> None:
        await ctx.gather(gives_up(ctx), ctx.step(echo, 3))

    assert await app.execute(caught, id="c") == "caught first in argument order"
    with pytest.raises(WorkflowFailedError):
        await app.execute(uncaught, id="u")
    assert (await app.inspect("u")).error == ("asyncio.exceptions.CancelledError", "mine")
    assert sorted(await check_replay(app)) == ["c", "u"]  # each replays as it ran


# -- a gather that changed shape -------------------------------------------------------------

RAN: list[str] = []


async def effect(name: str) -> str:
    RAN.append(name)
    return name


async def gathered_steps(ctx: Context) -> str:
    """The old code: a gather of two steps (0, 1; the gather at 2), a charge at 3."""
    await ctx.gather(ctx.step(effect, "a"), ctx.step(effect, "b"))
    await ctx.step(effect, "charge")
    await ctx.sleep(3600)
    return "done"


async def gathered_branches(ctx: Context) -> str:
    """The old code: a gather at 0 of two branches, each a step ((0, 0, 0), (0, 1, 0))."""

    async def branch(name: str) -> str:
        return str(await ctx.step(effect, name))

    await ctx.gather(branch("a"), branch("b"))
    await ctx.sleep(3600)
    return "done"


async def lost_a_branch(ctx: Context) -> str:
    await ctx.gather(ctx.step(effect, "a"))  # the gather now at 1, where b was
    await ctx.step(effect, "charge")
    await ctx.sleep(3600)
    return "done"


async def gained_a_branch(ctx: Context) -> str:
    # x at 2, where the old gather was; the gather at 3, where the charge was.
    await ctx.gather(ctx.step(effect, "a"), ctx.step(effect, "b"), ctx.step(effect, "x"))
    await ctx.step(effect, "charge")
    await ctx.sleep(3600)
    return "done"


async def a_step_where_branches_were(ctx: Context) -> str:
    await ctx.step(effect, "x")  # at 0, where the gather's branches were
    await ctx.sleep(3600)
    return "done"


async def lost_a_coroutine_branch(ctx: Context) -> str:
    async def branch(name: str) -> str:
        return str(await ctx.step(effect, name))

    await ctx.gather(branch("a"))  # the log holds the calls of a second branch
    await ctx.sleep(3600)
    return "done"


async def parked_in_a_branch(ctx: Context) -> str:
    """The old code: the sleep takes 0 as it is made, the gather 1; its branch 0 makes
    two steps ((1, 0, 0), (1, 0, 1)); the run parks in the sleep with both made; a
    charge follows at 2."""

    async def steps() -> None:
        await ctx.step(effect, "a")
        await ctx.step(effect, "a2")

    await ctx.gather(steps(), ctx.sleep(60))
    await ctx.step(effect, "charge")
    return "done"


async def a_branch_that_ends_sooner(ctx: Context) -> str:
    async def steps() -> None:
        await ctx.step(effect, "a")  # a2 is gone

    await ctx.gather(steps(), ctx.sleep(60))
    await ctx.step(effect, "charge")  # would run live: past the log
    return "done"


@pytest.mark.parametrize(
    ("old", "new", "position", "recorded", "attempted"),
    [
        (gathered_steps, lost_a_branch, "1", "step 'effect'", "ctx.gather() of 1 at "),
        (gathered_steps, gained_a_branch, "3", "step 'effect'", "ctx.gather() of 3 at "),
        (gathered_branches, a_step_where_branches_were, "0", "ctx.gather()", "step 'effect'"),
        (gathered_branches, lost_a_coroutine_branch, "0", "a call of branch 1",
         "ctx.gather() of 1 at "),
        (parked_in_a_branch, a_branch_that_ends_sooner, "1.0.1", "step 'effect'",
         "no call: the body stops short of it"),
    ],
    ids=["lost-a-branch", "gained-a-branch", "a-step-where-branches-were",
         "lost-a-coroutine-branch", "a-branch-that-ends-sooner"],
)
async def test_a_gather_that_changed_shape_diverges_before_anything_runs(
    old: object, new: object, position: str, recorded: str, attempted: str
) -> None:
    """A gather records nothing at its own position, so its shape shows only in where
    the calls around it land: a gather where the log holds another call, and a call
    where the log holds a gather's branches, diverge before a branch or the call runs
    (they ran live, their effects made again or made by code that then diverged)."""
    async with open_storage("memory://") as storage:
        first = Loom(storage, node="n", clock=VirtualClock(), recover=False)
        first.workflow(name="order")(old)  # type: ignore[type-var]
        async with first:
            await first.start("order", id="o")
            await first.drain()
            view = await first.inspect("o")
            assert view.park is not None
        before = list(await storage.events.read("o"))
        RAN.clear()
        resumed, error = await resume_with_new_code(storage, new, view.park.sequence)
        try:
            assert error.position == position
            assert error.recorded is not None
            assert error.recorded.startswith(recorded)
            assert error.attempted is not None
            assert error.attempted.startswith(attempted)
            assert RAN == []
            assert list(await storage.events.read("o")) == before
        finally:
            await resumed.__aexit__(None, None, None)


# The body's code is the same, the code it calls is not: a resume answers the park (its
# code is the code that started the execution), and the run diverges at the gather.
BRANCHES: list[Callable[[Context], Awaitable[None]]] = []


async def steps_a_a2(ctx: Context) -> None:
    await ctx.step(effect, "a")
    await ctx.step(effect, "a2")


async def steps_a(ctx: Context) -> None:
    await ctx.step(effect, "a")


async def sleeps(ctx: Context) -> None:
    await ctx.sleep(60)


async def gathers_the_branches(ctx: Context) -> str:
    await ctx.gather(*(branch(ctx) for branch in BRANCHES))
    await ctx.sleep(60)
    await ctx.step(effect, "charge")  # would run live: past the log
    return "done"


@pytest.mark.parametrize(
    ("old", "new", "position", "recorded", "attempted"),
    [
        ([steps_a, steps_a], [steps_a], "0", "a call of branch 1", "ctx.gather() of 1 at "),
        ([steps_a_a2, sleeps], [steps_a, sleeps], "0.0.1", "step 'effect'",
         "no call: its branch of the gather at "),
    ],
    ids=["lost-a-coroutine-branch", "a-branch-that-ends-sooner"],
)
async def test_a_run_whose_gather_changed_shape_diverges_before_it_goes_on(
    old: list[Callable[[Context], Awaitable[None]]],
    new: list[Callable[[Context], Awaitable[None]]],
    position: str,
    recorded: str,
    attempted: str,
) -> None:
    async with open_storage("memory://") as storage:
        first = Loom(storage, node="n", clock=VirtualClock(), recover=False)
        first.workflow(name="order")(gathers_the_branches)
        BRANCHES[:] = old
        async with first:
            await first.start("order", id="o")
            await first.drain()
            view = await first.inspect("o")
            assert view.park is not None
        before = list(await storage.events.read("o"))
        RAN.clear()
        BRANCHES[:] = new
        second = Loom(storage, node="n", clock=VirtualClock(), recover=False,
                      on_error=lambda exc: None)
        second.workflow(name="order")(gathers_the_branches)
        async with second:
            await second.resume("o", fence_if_parked_at=view.park.sequence)
            await second.drain()
            error = second.halted["o"]
            assert isinstance(error, ReplayDivergedError)
            assert error.position == position
            assert error.recorded is not None
            assert error.recorded.startswith(recorded)
            assert error.attempted is not None
            assert error.attempted.startswith(attempted)
        assert RAN == []  # neither a branch's call nor the charge ran
        log = list(await storage.events.read("o"))
        assert log[: len(before)] == before
        assert [e.kind for e in log[len(before):]] == ["EXECUTION_RESUMED"]


async def a_step_where_the_gather_was(ctx: Context) -> str:
    await ctx.step(effect, "a")
    await ctx.step(effect, "b")
    await ctx.step(effect, "x")  # at 2, where the gather of a and b was
    await ctx.step(effect, "charge")
    await ctx.sleep(3600)
    return "done"


async def test_check_replay_refuses_a_call_put_where_a_gather_of_made_calls_was() -> None:
    """The one gather change a live replay cannot see (docs/runtime.md, "Replay and
    positions"): check_replay, which may make no call the log lacks, refuses it."""
    async with open_storage("memory://") as storage:
        first = Loom(storage, node="n", clock=VirtualClock(), recover=False)
        first.workflow(name="order")(gathered_steps)
        async with first:
            await first.start("order", id="o")
            await first.drain()
        second = Loom(storage, node="n", clock=VirtualClock(), recover=False, timers=False)
        second.workflow(name="order")(a_step_where_the_gather_was)
        RAN.clear()
        async with second:
            with pytest.raises(ReplayDivergedError) as diverged:
                await check_replay(second)
        assert diverged.value.position == "3"  # the charge, which the code no longer reaches
        assert RAN == []


async def test_ctx_logger_is_quiet_while_the_body_replays(
    app: Loom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    @app.workflow(name="logs")
    async def logs(ctx: Context) -> str:
        ctx.logger.info("before the sleep of %s", ctx.execution_id)
        await ctx.sleep(60)
        ctx.logger.info("after the sleep")
        return "done"

    with caplog.at_level(logging.INFO, logger="loom_runtime.workflow.logs"):
        handle = await app.start(logs, id="l")
        await app.drain()
        await clock.advance(60)
        assert await handle.result(timeout=5) == "done"
        assert await check_replay(app) == ["l"]  # the whole body again, logging nothing
    said = [r.getMessage() for r in caplog.records if r.name == "loom_runtime.workflow.logs"]
    assert said == ["before the sleep of l", "after the sleep"]  # once each: not replayed


def one() -> int:
    return 1


@pytest.mark.parametrize("spans", [(10, 25), (25, 10), (10, 10), (0, 5)])
async def test_ctx_logger_logs_each_line_of_gather_branches_once(
    app: Loom, clock: VirtualClock, caplog: pytest.LogCaptureFixture, spans: tuple[int, int]
) -> None:
    """Branches that park and wake at different instants replay at each wake: a line is
    quiet while its own branch replays, not while another does, and the last line of a
    branch that ended before the run parked is not logged again."""

    async def branch(ctx: Context, name: str, seconds: int) -> None:
        ctx.logger.info("%s starts", name)
        await ctx.sleep(seconds)
        ctx.logger.info("%s slept", name)
        await ctx.step(one, name=f"{name}-step")
        ctx.logger.info("%s stepped", name)
        await ctx.sleep(seconds)
        ctx.logger.info("%s done", name)

    @app.workflow(name="fan")
    async def fan(ctx: Context) -> str:
        ctx.logger.info("fan starts")
        await ctx.gather(branch(ctx, "a", spans[0]), branch(ctx, "b", spans[1]))
        ctx.logger.info("joined")
        return "ok"

    caplog.set_level(logging.INFO, logger="loom_runtime.workflow.fan")
    handle = await app.start(fan, id="f")
    for _ in range(12):
        await clock.advance(5)
    assert await handle.result(timeout=5) == "ok"
    said = [r for r in caplog.records if r.name == "loom_runtime.workflow.fan"]
    lines = [
        "fan starts", "joined",
        *(f"{n} {what}" for n in "ab" for what in ("starts", "slept", "stepped", "done")),
    ]
    assert sorted(r.getMessage() for r in said) == sorted(lines)
    assert {(getattr(r, "execution_id", None), getattr(r, "workflow", None)) for r in said} == {
        ("f", "fan")
    }


async def test_ctx_logger_speaks_once_in_each_generation_of_a_continued_execution(
    app: Loom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    @app.workflow(name="loop")
    async def loop(ctx: Context, n: int) -> int:
        ctx.logger.info("generation %d", n)
        await ctx.sleep(10)
        ctx.logger.info("generation %d slept", n)
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n

    caplog.set_level(logging.INFO, logger="loom_runtime.workflow.loop")
    handle = await app.start(loop, 0, id="g")
    for _ in range(4):
        await clock.advance(10)
    assert await handle.result(timeout=5) == 2
    said = [r for r in caplog.records if r.name == "loom_runtime.workflow.loop"]
    assert [r.getMessage() for r in said] == [
        f"generation {n}{what}" for n in range(3) for what in ("", " slept")
    ]
    ids = [getattr(r, "execution_id", None) for r in said]
    assert len(set(ids)) == 3  # each generation is an execution of its own, named
    assert ids[0] == "g"


async def test_the_runtimes_own_lines_about_an_execution_carry_its_id(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A step's retry (INFO), its failure (WARNING) and a failure reported to on_error's
    default (ERROR) carry ``execution_id`` as ``ctx.logger``'s lines do, so a handler
    filters every line about an execution by one attribute."""
    from loom_runtime import Retry
    from loom_runtime.hooks import Hooks

    from loom_core import ExecutionNotFoundError

    app = Loom("memory://", node="n", clock=clock)

    def flaky() -> None:
        raise ConnectionError("refused")

    @app.workflow(name="retries")
    async def retries(ctx: Context) -> str:
        try:
            await ctx.step(flaky, retry=Retry(attempts=2, initial_interval=1))
        except StepFailedError:
            return "gave up"
        return "done"

    caplog.set_level(logging.INFO, logger="loom_runtime")
    async with app:
        handle = await app.start(retries, id="r-1")
        await clock.advance(1)
        assert await handle.result(timeout=5) == "gave up"
    Hooks().error(ExecutionNotFoundError("r-2"))
    said = [r for r in caplog.records if r.name == "loom_runtime"]
    assert [r.levelname for r in said] == ["INFO", "WARNING", "ERROR"]
    assert [getattr(r, "execution_id", None) for r in said] == ["r-1", "r-1", "r-2"]
    assert [getattr(r, "workflow", None) for r in said[:2]] == ["retries", "retries"]
