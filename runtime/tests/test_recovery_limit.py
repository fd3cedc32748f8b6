"""``@app.workflow(max_recoveries=...)``: an execution whose recovered runs keep dying
before they write anything is failed by the next recovery instead of run again, so a body
that kills its process does not kill its node at every start."""

from __future__ import annotations

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
        return [await ctx.step(lambda k=k: k, name=f"s{k}") for k in range(5)]

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
    the execution and serves the rest."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    url = f"sqlite:///{tmp_path / 'loom.db'}"

    async def run(mode: str) -> ChildProcess:
        child = await ChildProcess.spawn(
            sys.executable, str(script), url, mode, stderr=tmp_path / f"{mode}.err"
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
