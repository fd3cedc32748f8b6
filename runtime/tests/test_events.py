"""``ctx.set_event`` and ``app.get_event``: a workflow publishes a value under a key for
code outside it to read, durably, once, and the latest value wins."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from loom_runtime import AppNotRunningError, Context, Loom, NotJsonError, ReplayDivergedError
from loom_runtime.testing import check_replay, crash_at

from loom_core import EventKind, ExecutionNotFoundError, InvalidInputError, open_storage


async def events_of(app: Loom, execution_id: str) -> list[object]:
    return [
        (e.payload["name"], e.payload["result"])  # type: ignore[index,call-overload]
        for e in await app.storage.events.read(execution_id)
        if e.kind == EventKind.STEP_COMPLETED and e.payload["call"] == "event"  # type: ignore[index,call-overload]
    ]


async def test_a_parked_workflow_publishes_what_a_caller_reads(app: Loom) -> None:
    @app.workflow()
    async def checkout(ctx: Context, order: str) -> object:
        await ctx.set_event("payment_url", f"https://pay.example/{order}")
        paid = await ctx.receive("paid")
        await ctx.set_event("status", "paid")
        return paid

    handle = await app.start(checkout, "o-1", id="c")
    assert await app.get_event("c", "payment_url", timeout=5) == "https://pay.example/o-1"
    assert await handle.status() == "suspended"
    await app.send("c", "paid", True)
    assert await handle.result(timeout=5) is True
    assert await app.get_event("c", "status") == "paid"
    assert await events_of(app, "c") == [
        ("payment_url", "https://pay.example/o-1"),
        ("status", "paid"),
    ]
    assert await check_replay(app, ["c"]) == ["c"]


async def test_get_event_waits_for_the_value_and_the_latest_wins(app: Loom) -> None:
    gate = asyncio.Event()

    async def wait_gate() -> None:
        await gate.wait()

    @app.workflow()
    async def progress(ctx: Context) -> None:
        await ctx.set_event("stage", 1)
        await ctx.step(wait_gate)
        await ctx.set_event("stage", 2)
        await ctx.set_event("done", {"ok": True})
        await ctx.receive("never")

    await app.start(progress, id="p")
    waiting = asyncio.ensure_future(app.get_event("p", "done"))
    assert await app.get_event("p", "stage") == 1
    await asyncio.sleep(0)
    assert not waiting.done()
    gate.set()
    assert await asyncio.wait_for(waiting, 5) == {"ok": True}
    assert await app.get_event("p", "stage") == 2


async def test_none_when_it_ends_without_the_key_or_the_timeout_passes(app: Loom) -> None:
    @app.workflow()
    async def quiet(ctx: Context) -> str:
        return "done"

    @app.workflow()
    async def parked(ctx: Context) -> object:
        return await ctx.receive("never")

    await app.execute(quiet, id="q")
    assert await app.get_event("q", "anything") is None  # ended: no wait, even unbounded
    await app.start(parked, id="w")
    assert await app.get_event("w", "anything", timeout=0.05) is None


async def test_a_recovered_run_publishes_once(app: Loom) -> None:
    ran: list[int] = []

    async def after() -> None:
        ran.append(1)

    @app.workflow()
    async def once(ctx: Context) -> None:
        await ctx.set_event("k", "v")
        await ctx.step(after)

    crash_at(app, step="after", when="before")
    handle = await app.start(once, id="r")
    await app.drain()
    assert await app.get_event("r", "k") == "v"  # durable before the crash
    await app.recover()
    await handle.result(timeout=5)
    assert await events_of(app, "r") == [("k", "v")]
    assert ran == [1]


async def test_a_successors_value_replaces_its_predecessors(app: Loom) -> None:
    @app.workflow(name="chain")
    async def chain(ctx: Context, n: int) -> int:
        if n == 2:
            await ctx.set_event("stage", "first")
            await ctx.set_event("only-first", 1)
        if n == 1:
            await ctx.set_event("stage", "second")
        if n == 0:
            return 0
        ctx.continue_as_new(n - 1)

    assert await (await app.start(chain, 2, id="ch")).result(timeout=5) == 0
    assert await app.get_event("ch", "stage") == "second"
    assert await app.get_event("ch", "only-first") == 1
    assert await app.get_event("ch#1", "stage") == "second"  # a generation by its own id


async def test_a_changed_key_under_a_parked_execution_diverges(app: Loom) -> None:
    version = {"key": "a"}

    @app.workflow(name="keyed")
    async def keyed(ctx: Context) -> object:
        await ctx.set_event(version["key"], 1)
        return await ctx.receive("go")

    await app.start(keyed, id="d")
    await app.drain()
    version["key"] = "b"
    with pytest.raises(ReplayDivergedError, match="set_event"):
        await check_replay(app, ["d"])


@pytest.mark.parametrize(
    ("key", "value", "error", "says"),
    [
        ("", 1, InvalidInputError, "event key"),
        (3, 1, InvalidInputError, "event key"),
        ("k", object(), NotJsonError, "event 'k'"),
        ("k", math.nan, NotJsonError, "event 'k'"),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_written(
    app: Loom, key: object, value: object, error: type[Exception], says: str
) -> None:
    @app.workflow()
    async def bad(ctx: Context) -> str:
        try:
            await ctx.set_event(key, value)  # type: ignore[arg-type]
        except error as exc:
            return str(exc)
        return "accepted"

    assert says in await (await app.start(bad, id="b")).result(timeout=5)
    assert await events_of(app, "b") == []


async def test_get_event_refuses_what_it_cannot_read(app: Loom) -> None:
    with pytest.raises(ExecutionNotFoundError):
        await app.get_event("nobody", "k")
    for timeout in (-1, math.inf, "5", True):
        with pytest.raises(InvalidInputError, match="timeout="):
            await app.get_event("nobody", "k", timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="event key"):
        await app.get_event("nobody", "")


async def test_a_get_event_waiting_as_the_app_is_left_raises_app_not_running() -> None:
    """On a storage the caller opened, which stays open when the app is left, a get_event
    waiting for a value raises AppNotRunningError once the app is left (it read the
    open store for ever, with nothing of this process left to publish the value)."""
    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", timers=False)

        @app.workflow(name="quiet")
        async def quiet(ctx: Context) -> object:
            return await ctx.receive("t")

        async with app:
            await app.start(quiet, id="q")
            await app.drain()
            reader = asyncio.create_task(app.get_event("q", "stage"))
            await asyncio.sleep(0)  # it waits now
        with pytest.raises(AppNotRunningError, match=r"app\.get_event was cut short"):
            await asyncio.wait_for(reader, 10)  # a bound, never reached: it ends at once


async def test_a_get_event_waiting_as_an_app_on_a_url_is_left_says_it_was_cut_short() -> None:
    """The app opened its storage from a URL and closes it as it is left: a get_event
    waiting for a value raises AppNotRunningError saying it was cut short by leaving (it
    said app.storage needs a running app, to be called inside 'async with app:', which
    it was)."""
    app = Loom("memory://", node="n", timers=False)

    @app.workflow(name="quiet")
    async def quiet(ctx: Context) -> object:
        return await ctx.receive("t")

    async with app:
        await app.start(quiet, id="q")
        await app.drain()
        reader = asyncio.create_task(app.get_event("q", "stage"))
        await asyncio.sleep(0)  # it waits now
    with pytest.raises(AppNotRunningError, match=r"app\.get_event was cut short"):
        await asyncio.wait_for(reader, 10)  # a bound, never reached: it ends at once


async def test_a_value_outlives_a_restart_and_a_cancel_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'loom.db'}"

    def app() -> Loom:
        loom = Loom(url, node="n")

        @loom.workflow(name="checkout")
        async def checkout(ctx: Context) -> object:
            await ctx.set_event("stage", "awaiting payment")
            await ctx.set_event("stage", "paid")
            return await ctx.receive("ship")

        return loom

    async with app() as first:
        await first.start("checkout", id="o")
        await first.drain()  # parked on the receive
        assert await first.get_event("o", "stage") == "paid"
    async with app() as again:
        assert await again.get_event("o", "stage", timeout=0) == "paid"
        reader = asyncio.create_task(again.get_event("o", "shipped"))
        await asyncio.sleep(0)  # it waits now
        await again.cancel("o")
        assert await asyncio.wait_for(reader, 10) is None  # ended without the key
        assert await again.get_event("o", "stage") == "paid"  # a cancel keeps the value
        assert await events_of(again, "o") == [
            ("stage", "awaiting payment"), ("stage", "paid")
        ]
        assert await check_replay(again) == ["o"]


async def test_a_reader_in_another_app_on_the_file_gets_the_value_when_it_is_set(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    worker = Loom(url, node="worker")
    client = Loom(url, node="client", timers=False)

    @worker.workflow(name="job")
    async def job(ctx: Context) -> None:
        stage = await ctx.receive("go")
        await ctx.set_event("stage", stage)

    async with worker, client:
        await worker.start(job, id="j")
        reader = asyncio.create_task(client.get_event("j", "stage"))
        await asyncio.sleep(0)  # it waits now, polling the file
        await client.send("j", "go", {"reached": 2})
        assert await asyncio.wait_for(reader, 30) == {"reached": 2}
