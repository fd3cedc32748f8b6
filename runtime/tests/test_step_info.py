"""``step_info()``: a step's function learns which step of which execution it is, which
attempt, and a key that is the same for every run of that step."""

from __future__ import annotations

import asyncio

from loom_runtime import Context, Loom, Retry, StepInfo, step_info
from loom_runtime.testing import VirtualClock


async def test_sync_and_async_steps_see_their_step(app: Loom) -> None:
    seen: list[StepInfo | None] = []

    def sync_step() -> None:
        seen.append(step_info())

    async def async_step() -> None:
        await asyncio.sleep(0)
        seen.append(step_info())

    def bounded() -> None:  # a step with a timeout runs on a thread of its own
        seen.append(step_info())

    @app.workflow(name="w")
    async def w(ctx: Context) -> None:
        seen.append(step_info())  # the body is not a step
        await ctx.step(sync_step, name="first")
        await ctx.step(async_step, name="second")
        await ctx.step(bounded, name="third", timeout=30)

    await app.execute(w, id="order-1")
    assert seen == [
        None,
        StepInfo("order-1", "0", "first", 1),
        StepInfo("order-1", "1", "second", 1),
        StepInfo("order-1", "2", "third", 1),
    ]
    assert seen[1] is not None
    assert seen[1].idempotency_key == "order-1:0"
    assert step_info() is None


async def test_a_gather_branch_step_has_its_branch_position(app: Loom) -> None:
    keys: list[str] = []

    def record(label: str) -> str:
        info = step_info()
        assert info is not None
        keys.append(info.idempotency_key)
        return label

    @app.workflow(name="w")
    async def w(ctx: Context) -> None:
        await ctx.step(record, "first")
        await ctx.gather(ctx.step(record, "a"), ctx.step(record, "b"))

    await app.execute(w, id="g")
    assert sorted(keys) == ["g:0", "g:1", "g:2"]


async def test_attempts_count_on_and_the_key_stays(app: Loom, clock: VirtualClock) -> None:
    seen: list[tuple[int, str]] = []

    def flaky() -> str:
        info = step_info()
        assert info is not None
        seen.append((info.attempt, info.idempotency_key))
        if info.attempt < 3:
            raise ConnectionError("try again")
        return "ok"

    @app.workflow(name="w")
    async def w(ctx: Context) -> str:
        return await ctx.step(flaky, retry=Retry(attempts=5, initial_interval=1))

    handle = await app.start(w, id="r")
    await clock.advance(10)
    assert await handle.result(timeout=5) == "ok"
    assert seen == [(1, "r:0"), (2, "r:0"), (3, "r:0")]


class Died(BaseException):
    """What a process death looks like to the run: nothing after it is recorded."""


async def test_a_step_run_again_after_its_run_died_has_the_same_key(app: Loom) -> None:
    runs: list[tuple[int, str]] = []

    def charge() -> str:
        info = step_info()
        assert info is not None
        runs.append((info.attempt, info.idempotency_key))
        if len(runs) == 1:
            raise Died  # the process dies with the charge made and its result unwritten
        return "charged"

    @app.workflow(name="w")
    async def w(ctx: Context) -> str:
        return await ctx.step(charge)

    handle = await app.start(w, id="c")
    await app.drain()
    assert await handle.status() == "running"  # nothing recorded: the run stopped
    app.reported.clear()  # type: ignore[attr-defined]  # the stop, told to on_error
    await app.recover()
    assert await handle.result(timeout=5) == "charged"
    # The same step again, so the same key: a payment service that deduplicates by it
    # charges once.
    assert runs == [(1, "c:0"), (1, "c:0")]


def test_outside_any_run_there_is_no_step() -> None:
    assert step_info() is None


async def test_the_attempt_counts_on_across_a_process_death() -> None:
    from loom_core import open_storage

    attempts: list[int] = []

    def flaky() -> str:
        info = step_info()
        assert info is not None
        attempts.append(info.attempt)
        if info.attempt < 3:
            raise ConnectionError("gateway down")
        return "ok"

    async def w(ctx: Context) -> str:
        return await ctx.step(flaky, retry=Retry(attempts=5, initial_interval=60))

    clock = VirtualClock()
    async with open_storage("memory://") as storage:
        first = Loom(storage, node="n", clock=clock)
        first.workflow(name="w")(w)
        async with first:
            await first.start("w", id="r")
            await clock.advance(1)  # attempt 1 failed; the process dies in the wait
        assert attempts == [1]
        second = Loom(storage, node="n", clock=clock)
        second.workflow(name="w")(w)
        async with second:  # recovers it
            await clock.advance(200)
            assert await second.get("r").result(timeout=5) == "ok"
    assert attempts == [1, 2, 3]
