"""``@app.workflow(max_recoveries=...)``: an execution whose recovered runs keep dying
before they write anything is failed by the next recovery instead of run again, so a body
that kills its process does not kill its node at every start."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from loom_runtime import (
    MAX_RECOVERIES,
    Context,
    Loom,
    RecoveryLimitError,
    WorkflowFailedError,
)
from loom_runtime.testing import ChildProcess, VirtualClock, crash_at

from loom_core import EventKind, InvalidOptionError

RECOVERED = EventKind.EXECUTION_RECOVERED


async def kinds(app: Loom, execution_id: str) -> list[str]:
    return [str(e.kind) for e in await app.storage.events.read(execution_id)]


async def test_an_execution_recovered_without_progress_is_failed_at_the_limit(
    app: Loom, clock: VirtualClock
) -> None:
    ran: list[str] = []

    def poison() -> None:
        ran.append("poison")

    @app.workflow(name="poisoned", max_recoveries=2)
    async def poisoned(ctx: Context) -> None:
        await ctx.sleep(60)
        await ctx.step(poison)

    # Each run dies before the step, as a process killed by it would.
    point = crash_at(app, step="poison", times=10)
    await app.start(poisoned, id="p", execution_timeout=3600)
    await clock.advance(60)
    assert point.count == 1
    for recoveries in (1, 2):
        assert [h.execution_id for h in await app.recover()] == ["p"]
        await app.drain()
        assert point.count == 1 + recoveries
        assert (await app.inspect("p")).recoveries == recoveries
    assert await app.recover() == []  # the third is refused: it is failed instead
    assert point.count == 3
    view = await app.inspect("p")
    assert view.status == "failed"
    assert view.error is not None
    assert view.error[0] == "loom_runtime.errors.RecoveryLimitError"
    assert "recovered 2 times in a row" in view.error[1]
    assert (await kinds(app, "p"))[-3:] == [RECOVERED, RECOVERED, EventKind.EXECUTION_FAILED]
    assert list(await app.storage.timers.pending("p")) == []  # its deadline's row too
    reported = app.reported  # type: ignore[attr-defined]
    assert [type(e) for e in reported] == [RecoveryLimitError]
    assert reported[0].execution_id == "p"
    assert reported[0].recoveries == 2
    with pytest.raises(WorkflowFailedError, match="RecoveryLimitError"):
        await app.get("p").result(timeout=5)
    assert ran == []


async def test_a_run_that_writes_between_recoveries_is_never_failed(app: Loom) -> None:
    @app.workflow(name="progress", max_recoveries=1)
    async def progress(ctx: Context) -> list[int]:
        return [await ctx.step(lambda k: k, k, name=f"s{k}") for k in range(5)]

    # Each run records one step and dies: never two recoveries in a row.
    crash_at(app, position=0, when="after")
    await app.start(progress, id="p")
    await app.drain()
    for position in range(1, 5):
        crash_at(app, position=position, when="after")
        assert [h.execution_id for h in await app.recover()] == ["p"]
        await app.drain()
        assert (await app.inspect("p")).recoveries == 0  # its step came after
    await app.recover()
    assert await app.get("p").result(timeout=5) == [0, 1, 2, 3, 4]
    assert (await kinds(app, "p")).count(RECOVERED) == 5


async def test_none_never_gives_up(app: Loom) -> None:
    @app.workflow(name="patient", max_recoveries=None)
    async def patient(ctx: Context) -> str:
        return await ctx.step(lambda: "done", name="work")

    point = crash_at(app, step="work", times=12)
    await app.start(patient, id="p")
    await app.drain()
    for _ in range(11):
        await app.recover()
        await app.drain()
    assert point.count == 12
    assert (await app.inspect("p")).recoveries == 11
    await app.recover()
    assert await app.get("p").result(timeout=5) == "done"


def test_the_default_is_dbos_s() -> None:
    assert MAX_RECOVERIES == 100


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_a_bad_limit_is_refused_where_it_is_written(bad: object) -> None:
    app = Loom("memory://")
    with pytest.raises(InvalidOptionError, match="max_recoveries="):
        app.workflow(name="w", max_recoveries=bad)  # type: ignore[call-overload]
    assert "w" not in app.workflows


WORKER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from loom_runtime import Context, Loom

    app = Loom(sys.argv[1], node="worker-1", poll_interval=0.05)

    def kill_my_process() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @app.workflow(name="poisoned", max_recoveries=2)
    async def poisoned(ctx: Context) -> None:
        # A set literal: its constant's repr follows string hashing, which differs
        # between these processes; the code's digest must not.
        if ctx.execution_id in {"poisoned", "toxic", "venomous", "baneful", "noxious"}:
            await ctx.step(kill_my_process)

    @app.workflow(name="fine")
    async def fine(ctx: Context) -> str:
        return "fine"

    async def main() -> None:
        async with app:
            if sys.argv[2] == "start":
                print("starting", flush=True)
                await app.start(poisoned, id="poisoned")
                await asyncio.sleep(30)  # the step kills this process
            await app.drain()
            print("up", flush=True)
            print(await app.execute(fine, id="fine-" + sys.argv[2]), flush=True)
            print((await app.inspect("poisoned")).status, flush=True)

    asyncio.run(main())
    """
)


async def test_a_body_that_kills_its_process_stops_killing_the_node(tmp_path: Path) -> None:
    """Real processes, really killed by the step they run: the node's third start fails
    the execution and serves the rest. Each process hashes strings with a seed of its
    own, as processes do, and still counts as the same code."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    seeds = iter(range(1, 5))

    async def run(mode: str) -> ChildProcess:
        env = {**os.environ, "PYTHONHASHSEED": str(next(seeds))}
        child = await ChildProcess.spawn(
            sys.executable, str(script), url, mode, stderr=tmp_path / f"{mode}.err", env=env
        )
        await child.finish()
        return child

    first = await run("start")
    assert first.lines == ["starting"]
    assert first.killed, first.stderr_tail()
    for restart in ("again-1", "again-2"):  # two recoveries, each killed by the step
        child = await run(restart)
        assert child.returncode == -signal.SIGKILL, child.stderr_tail()
        assert child.lines == []
    last = await run("again-3")
    assert last.returncode == 0, last.stderr_tail()
    assert last.lines == ["up", "fine", "failed"]
    assert "RecoveryLimitError" in last.stderr_tail()  # on_error's default: logged


async def test_a_process_carrying_on_its_runs_after_a_store_outage_is_not_limited() -> None:
    """Takeovers by a live process whose store failed under its run are not deaths: with
    max_recoveries=1, two outages in a row still end with the execution completed."""
    from test_failed_store_calls import failing

    async with failing() as f:
        calls: list[int] = []

        def charge() -> str:
            calls.append(1)
            if len(calls) <= 2:
                f.switch.down = True  # the store goes down while the step runs
            return "charged"

        @f.app.workflow(name="order", max_recoveries=1)
        async def order(ctx: Context) -> str:
            return await ctx.step(charge, name="charge")

        handle = await f.app.start(order, id="o")
        await f.app.drain()
        for _ in range(2):
            f.switch.down = False
            await f.wait_out(40)
        assert await handle.result(timeout=5) == "charged"
        kinds = [str(e.kind) for e in await f.base.events.read("o")]
        assert kinds.count(RECOVERED) == 2
        assert not any(isinstance(e, RecoveryLimitError) for e in f.errors)


async def first(ctx: Context) -> str:
    await ctx.step(lambda: 1, name="a")
    await ctx.step(lambda: 2, name="b")
    return "done"


async def renamed(ctx: Context) -> str:  # a deploy that renamed step a: it diverges
    await ctx.step(lambda: 1, name="renamed")
    await ctx.step(lambda: 2, name="b")
    return "done"


async def fixed(ctx: Context) -> str:
    await ctx.step(lambda: 1, name="a")
    await ctx.step(lambda: 2, name="b")
    return "fixed"


async def test_recoveries_count_only_while_the_code_stays_the_same() -> None:
    """Restarts with code whose replay diverges write a takeover each and nothing after
    it, as deaths do; the count is of takeovers by the same code, so the start that
    deploys the fix carries the execution on rather than failing it, and the same
    diverging code restarted past the limit fails it."""
    from loom_core import open_storage

    async with open_storage("memory://") as storage:

        def node(body: object, errors: list[BaseException]) -> Loom:
            app = Loom(storage, node="n", timers=False, on_error=errors.append)
            app.workflow(name="order", max_recoveries=2)(body)  # type: ignore[type-var]
            return app

        errors: list[BaseException] = []
        app = node(first, errors)
        async with app:
            crash_at(app, step="b")  # the process dies with step a recorded
            await app.start("order", id="o")
            await app.drain()
        for _ in range(2):  # two restarts with the diverging deploy
            errors = []
            async with node(renamed, errors) as app:
                await app.drain()
            assert [type(e).__name__ for e in errors] == ["ReplayDivergedError"]
            view = await app.inspect("o")
        assert (view.status, view.recoveries) == ("running", 2)
        errors = []
        async with node(fixed, errors) as app:
            assert await app.get("o").result(timeout=5) == "fixed"
        assert errors == []

        app = node(first, errors)
        async with app:
            crash_at(app, step="b")
            await app.start("order", id="p")
            await app.drain()
        for _ in range(2):
            async with node(renamed, []) as app:
                await app.drain()
        async with node(renamed, errors) as app:
            await app.drain()
        assert [type(e) for e in errors] == [RecoveryLimitError]
        assert (await app.inspect("p")).status == "failed"


async def test_on_error_hears_of_the_failure_even_when_its_timer_rows_cannot_go(
    app: Loom, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom_core import StorageUnavailableError

    @app.workflow(name="poisoned", max_recoveries=1)
    async def poisoned(ctx: Context) -> None:
        await ctx.step(lambda: None, name="poison")

    crash_at(app, step="poison", times=2)
    await app.start(poisoned, id="p", execution_timeout=3600)
    await app.drain()
    await app.recover()
    await app.drain()

    async def down(execution_id: str, wake_at: object = None) -> int:
        raise StorageUnavailableError("the timer store is down")

    monkeypatch.setattr(app.storage.timers, "cancel", down)
    with pytest.raises(StorageUnavailableError):
        await app._recover_one("p")  # what recover() reports to on_storage_error
    assert (await app.inspect("p")).status == "failed"
    reported = app.reported  # type: ignore[attr-defined]
    assert [type(e) for e in reported] == [RecoveryLimitError]


async def test_a_process_does_not_take_over_again_what_diverged_in_it(app: Loom) -> None:
    version = "v1"

    @app.workflow(name="order")
    async def order(ctx: Context) -> str:
        await ctx.step(lambda: 1, name="a" if version == "v1" else "renamed")
        return await ctx.step(lambda: "done", name="b")

    crash_at(app, step="b")
    await app.start(order, id="o")
    await app.drain()
    version = "bad"
    await app.recover()
    await app.drain()
    reported = app.reported  # type: ignore[attr-defined]
    assert [type(e).__name__ for e in reported] == ["ReplayDivergedError"]
    before = await kinds(app, "o")
    assert await app.recover() == []  # the same code would diverge again
    assert await kinds(app, "o") == before
