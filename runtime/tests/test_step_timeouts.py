"""``ctx.step(..., timeout=)``: each attempt is bounded; one that runs longer fails with
TimeoutError, which a Retry retries as any failure, and the last is recorded."""

from __future__ import annotations

import asyncio
import math
import threading
from datetime import timedelta

import pytest
from loom_runtime import Context, InvalidDurationError, Loom, Retry, StepFailedError
from loom_runtime.testing import check_replay

from loom_core import EventKind

NEVER = 0.05
"""A timeout for steps that never finish: any bound fails them, so a short one keeps the
tests quick without making them depend on how fast the machine is."""


async def test_an_attempt_past_its_timeout_fails_with_timeout_error_and_is_cancelled(
    app: Loom,
) -> None:
    cancelled: list[bool] = []

    async def hangs() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    @app.workflow()
    async def bounded(ctx: Context) -> list[object]:
        try:
            return [await ctx.step(hangs, name="hangs", timeout=NEVER)]
        except StepFailedError as exc:
            return [exc.error_type, exc.error_message, exc.attempts]

    handle = await app.start(bounded, id="h")
    assert await handle.result(timeout=10) == [
        "TimeoutError",
        "step 'hangs' did not finish within its timeout of 0.05 s (attempt 1)",
        1,
    ]
    assert cancelled == [True]
    failed = [e for e in await app.storage.events.read("h") if e.kind == EventKind.STEP_FAILED]
    assert len(failed) == 1
    assert await check_replay(app, ["h"]) == ["h"]


async def test_a_retry_tries_again_after_a_timeout_until_an_attempt_finishes(
    app: Loom,
) -> None:
    attempts: list[int] = []

    async def slow_then_quick() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            await asyncio.Event().wait()
        return "done"

    @app.workflow()
    async def patient(ctx: Context) -> object:
        retry = Retry(attempts=3, initial_interval=0)
        return await ctx.step(slow_then_quick, retry=retry, timeout=timedelta(seconds=NEVER))

    handle = await app.start(patient, id="r")
    assert await handle.result(timeout=10) == "done"
    assert attempts == [1, 2, 3]
    completed = [
        e for e in await app.storage.events.read("r") if e.kind == EventKind.STEP_COMPLETED
    ]
    assert completed[0].payload["attempt"] == 3  # type: ignore[index,call-overload]


async def test_timeout_error_can_be_made_non_retryable(app: Loom) -> None:
    attempts: list[int] = []

    async def hangs() -> None:
        attempts.append(1)
        await asyncio.Event().wait()

    @app.workflow()
    async def once(ctx: Context) -> object:
        retry = Retry(attempts=5, initial_interval=0, non_retryable=(TimeoutError,))
        try:
            await ctx.step(hangs, retry=retry, timeout=NEVER)
        except StepFailedError as exc:
            return exc.error_type
        return "finished"

    assert await (await app.start(once, id="n")).result(timeout=10) == "TimeoutError"
    assert attempts == [1]


async def test_a_sync_step_past_its_timeout_fails_and_its_thread_runs_on(app: Loom) -> None:
    release = threading.Event()
    finished = threading.Event()

    def blocks() -> str:
        release.wait()
        finished.set()
        return "late"

    @app.workflow()
    async def threaded(ctx: Context) -> object:
        try:
            return await ctx.step(blocks, timeout=NEVER)
        except StepFailedError as exc:
            return exc.error_type

    handle = await app.start(threaded, id="s")
    try:
        assert await handle.result(timeout=10) == "TimeoutError"
        assert not finished.is_set()  # the thread still waits: it cannot be stopped
    finally:
        release.set()
    await asyncio.to_thread(finished.wait, 10)
    kinds = [e.kind for e in await app.storage.events.read("s")]
    assert kinds.count(EventKind.STEP_COMPLETED) == 0  # its late result is dropped


async def test_a_step_that_raises_timeout_error_itself_keeps_its_own_words(app: Loom) -> None:
    async def gives_up() -> None:
        raise TimeoutError("the card network did not answer")

    @app.workflow()
    async def own(ctx: Context) -> object:
        try:
            await ctx.step(gives_up, timeout=60)
        except StepFailedError as exc:
            return exc.error_message
        return "finished"

    assert await (await app.start(own, id="o")).result(timeout=10) == (
        "the card network did not answer"
    )


async def test_a_step_within_its_timeout_returns_its_result(app: Loom) -> None:
    async def quick(x: int) -> int:
        return x * 2

    @app.workflow()
    async def fine(ctx: Context) -> object:
        return await ctx.step(quick, 21, timeout=60)

    assert await (await app.start(fine, id="f")).result(timeout=10) == 42


@pytest.mark.parametrize("late", ["returns", "raises"])
async def test_an_attempt_that_ignores_the_cancel_has_still_timed_out(
    app: Loom, late: str
) -> None:
    attempts: list[int] = []
    cancelled = asyncio.Event()
    finish = asyncio.Event()

    async def stubborn() -> str:
        attempts.append(1)
        if len(attempts) == 2:
            return "second"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()  # the bound has passed
            await finish.wait()  # and it goes on, as a careless client may
            if late == "raises":
                raise RuntimeError("cleaning up after the cancel failed") from None
        return "first, too late"

    @app.workflow()
    async def bounded(ctx: Context) -> object:
        return await ctx.step(
            stubborn,
            retry=Retry(attempts=2, initial_interval=0, non_retryable=(RuntimeError,)),
            timeout=NEVER,
        )

    handle = await app.start(bounded, id="late")
    await cancelled.wait()
    finish.set()
    # The first attempt's late result (or error) is dropped, and the second is taken.
    assert await handle.result(timeout=10) == "second"
    assert attempts == [1, 1]


async def test_timed_sync_steps_left_running_take_no_worker_from_other_steps(
    app: Loom,
) -> None:
    release = threading.Event()
    threads: list[threading.Thread] = []

    def blocks() -> None:
        threads.append(threading.current_thread())
        release.wait()

    def untimed() -> str:
        return "ran"

    @app.workflow()
    async def hung(ctx: Context) -> object:
        try:
            await ctx.step(blocks, timeout=NEVER)
        except StepFailedError as exc:
            return exc.error_type
        return "finished"

    @app.workflow()
    async def other(ctx: Context) -> object:
        return await ctx.step(untimed)

    # More left running than the default executor has workers (min(32, cpus + 4)).
    try:
        results = await asyncio.gather(*(app.execute(hung, id=f"h{k}") for k in range(40)))
        assert results == ["TimeoutError"] * 40
        assert len(threads) == 40
        assert all(t.daemon and t.name == "loom-step" for t in threads)
        assert await app.execute(other, id="o") == "ran"  # the shared executor is free
    finally:
        release.set()


@pytest.mark.parametrize(
    ("limit", "says"),
    [
        (0, "more than 0 seconds, not 0; leave timeout= out for no bound"),
        (-1, "more than 0 seconds"),
        (math.nan, "number of seconds"),
        ("5", "takes seconds"),
        (True, "takes seconds"),
        (10.0**12, "check the unit (seconds), or leave timeout= out for no bound"),
        (math.inf, "leave timeout= out for no bound"),
    ],
)
async def test_a_bad_timeout_is_refused_before_the_step_runs(
    app: Loom, limit: object, says: str
) -> None:
    ran: list[int] = []

    async def effect() -> None:
        ran.append(1)

    @app.workflow()
    async def bad(ctx: Context) -> str:
        try:
            await ctx.step(effect, timeout=limit)  # type: ignore[call-overload, call-arg]
        except InvalidDurationError as exc:
            return str(exc)
        return "accepted"

    assert says in await (await app.start(bad, id="b")).result(timeout=10)
    assert ran == []
    kinds = [e.kind for e in await app.storage.events.read("b")]
    assert kinds == [EventKind.EXECUTION_STARTED, EventKind.EXECUTION_COMPLETED]


@pytest.mark.parametrize("bound", [None, 3600])
async def test_a_sync_step_that_raises_stop_iteration_fails_with_it(
    app: Loom, bound: int | None
) -> None:
    """``next()`` on an empty iterator in a sync step is a failure like any other, bounded
    or not (asyncio cannot hand a StopIteration across its thread: the run hung)."""

    def first_item() -> object:
        return next(iter([]))

    @app.workflow()
    async def takes_first(ctx: Context) -> list[object]:
        try:
            return [await ctx.step(first_item, timeout=bound)]
        except StepFailedError as exc:
            return [exc.error_type, exc.attempts]

    handle = await app.start(takes_first, id="f")
    assert await handle.result(timeout=10) == ["StopIteration", 1]
    assert await check_replay(app, ["f"]) == ["f"]
