"""An app lives in the event loop it was entered in: a call from another loop (another
thread's, a test's own) is refused with a typed error before anything is written, and
``asyncio.run_coroutine_threadsafe`` is the way in from another thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from loom_runtime import AppNotRunningError, Context, Loom, OtherEventLoopError, Retry
from loom_runtime.testing import VirtualClock

from loom_core import Storage, open_storage


def _build(storage: Storage) -> Loom:
    app = Loom(storage, node="n1")

    @app.workflow(name="greet")
    async def greet(ctx: Context, name: str) -> str:
        await ctx.sleep(0)
        return f"hello {name}"

    return app


@pytest.fixture
def entered_elsewhere() -> Iterator[tuple[Loom, asyncio.AbstractEventLoop]]:
    """An app entered in an event loop of its own, not running while the test runs."""
    loop = asyncio.new_event_loop()
    storage = loop.run_until_complete(open_storage("memory://"))
    app = _build(storage)
    loop.run_until_complete(app.__aenter__())
    try:
        yield app, loop
    finally:
        loop.run_until_complete(app.__aexit__(None, None, None))
        loop.run_until_complete(storage.close())
        loop.close()


async def test_calls_from_another_event_loop_are_refused_and_write_nothing(
    entered_elsewhere: tuple[Loom, asyncio.AbstractEventLoop],
) -> None:
    app, _ = entered_elsewhere
    with pytest.raises(OtherEventLoopError, match="run_coroutine_threadsafe"):
        await app.start("greet", "ada", id="a")
    with pytest.raises(OtherEventLoopError):
        await app.execute("greet", "ada", id="b")
    for refused in (
        app.send("a", "topic"),
        app.cancel("a"),
        app.get("a").result(),
        app.inspect("a"),
        app.drain(),
        app.recover(),
    ):
        with pytest.raises(OtherEventLoopError):
            await refused
    assert await app.storage.events.list_executions(after=None, limit=10) == ()


async def test_the_refusal_is_an_app_not_running_error_and_a_runtime_error(
    entered_elsewhere: tuple[Loom, asyncio.AbstractEventLoop],
) -> None:
    app, _ = entered_elsewhere
    with pytest.raises(AppNotRunningError):
        await app.start("greet", "ada")
    with pytest.raises(RuntimeError):
        await app.start("greet", "ada")


def test_a_call_after_the_apps_loop_closed_unleft_says_to_leave_it_in_that_loop() -> None:
    loop = asyncio.new_event_loop()
    storage = loop.run_until_complete(open_storage("memory://"))
    app = _build(storage)
    loop.run_until_complete(app.__aenter__())
    for task in asyncio.all_tasks(loop):  # what a test runner closing its loop does
        task.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    with pytest.raises(OtherEventLoopError, match="loop is closed"):
        asyncio.run(app.start("greet", "ada"))
    with pytest.raises(OtherEventLoopError, match="loop is closed"):
        asyncio.run(app.__aenter__())


def test_run_coroutine_threadsafe_reaches_an_app_running_in_another_thread() -> None:
    entered = threading.Event()
    held: list[tuple[Loom, asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def serve() -> None:
        leave = asyncio.Event()
        async with _build(await open_storage("memory://")) as app:
            held.append((app, asyncio.get_running_loop(), leave))
            entered.set()
            await leave.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    entered.wait()
    app, loop, leave = held[0]
    try:
        # What a synchronous view (Flask, Django) does with an app served by another thread.
        done = asyncio.run_coroutine_threadsafe(app.execute("greet", "ada", id="a"), loop)
        assert done.result() == "hello ada"
    finally:
        loop.call_soon_threadsafe(leave.set)
        thread.join()


def test_one_app_entered_again_in_a_new_event_loop_runs_there() -> None:
    """Each pytest-asyncio test has its own loop: an app built once is entered in each."""
    app = Loom("memory://", node="n1")

    @app.workflow(name="greet")
    async def greet(ctx: Context, name: str) -> str:
        await ctx.sleep(0)
        return f"hello {name}"

    async def use(name: str) -> str:
        async with app:
            return await app.execute(greet, name)

    assert asyncio.run(use("ada")) == "hello ada"
    assert asyncio.run(use("grace")) == "hello grace"


def test_schedules_held_by_a_drain_are_started_in_each_new_event_loop() -> None:
    """A drain holds a schedule's instants; in an app entered again in a new loop it
    still does, and starts them after it (the scheduler's wait was tied to the first
    loop: it died there, and the schedule fired no more)."""
    clock = VirtualClock()
    errors: list[BaseException] = []
    app = Loom("memory://", node="n1", clock=clock, on_error=errors.append)
    failed: list[str] = []

    def flaky(attempt: str) -> str:
        if attempt not in failed:
            failed.append(attempt)
            raise ConnectionError("the service is down")
        return "ok"

    @app.workflow(name="retrying")
    async def retrying(ctx: Context, attempt: str) -> str:
        return await ctx.step(
            flaky, attempt, retry=Retry(attempts=2, initial_interval=100, max_interval=100)
        )

    @app.scheduled(every=60)
    @app.workflow(name="tick")
    async def tick(ctx: Context, scheduled_at: str) -> str:
        return scheduled_at

    async def held_by_a_drain(attempt: str) -> list[str]:
        async with app:
            await app.start(retrying, attempt, id="r")
            await clock.advance(0)  # the first attempt failed: the next is due at +100 s
            drain = asyncio.create_task(app.drain())
            await asyncio.wait_for(clock.advance(150), 10)  # a bound, never reached
            await asyncio.wait_for(drain, 10)
            return [view.workflow async for view in app.executions()]

    assert asyncio.run(held_by_a_drain("first")) == ["retrying", "tick", "tick"]
    assert asyncio.run(held_by_a_drain("second")) == ["retrying", "tick", "tick"]
    assert errors == []


async def test_an_execute_waiting_on_a_parked_run_when_the_app_is_left_names_execute() -> None:
    """What a request handler awaiting app.execute sees as its server shuts down."""
    app = Loom("memory://", node="n1")

    @app.workflow(name="waiting")
    async def waiting(ctx: Context) -> None:
        await ctx.receive("go")

    async with app:
        call = asyncio.create_task(app.execute(waiting, id="w"))
        await app.drain()  # its run has parked: the execute now waits for the result
    with pytest.raises(AppNotRunningError, match=r"^app\.execute was cut short"):
        await call
