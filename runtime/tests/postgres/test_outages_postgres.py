"""A worker process (``loom worker --app outage_app:app``) lives through PostgreSQL going
away and coming back, as an operator would see it: the server restarted, the server down
for longer than the store retries, the app's sessions terminated from another session.

Each test holds three executions of :data:`outage_app.WORKFLOW` at the three places a
workflow waits: one mid-step (its step ``a`` started, held at its gate), one parked on a
sleep, one parked on a receive. Then the database goes away and comes back, with no
restart of the worker; the held step is let go and every receiver is sent its message.
Afterwards every execution has completed exactly once, its steps recorded once each, by
the worker whose process never changed (so its timer service and its message delivery
carried on by themselves), and each step's effect (traced outside Loom) ran once, or, where
a run's record could not be written while the server was down, ran again only after a run
that left no record. Whatever the worker's hooks heard meanwhile is a LoomError, the worker
is still alive and stops cleanly, and each ``handle.result()`` caller got the result or a
typed error. A worker stopped (SIGTERM) while the database is down leaves cleanly, and the
next worker of its node, started once the database is back, finishes what it ran.

The server is a cluster of this module's own (``ThrowawayCluster``), since the tests stop
and restart it; every test gets a database of its own on it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import outage_app
import pytest
from loom_conformance.ci import in_ci
from loom_conformance.postgres import (
    PostgresServer,
    ThrowawayCluster,
    find_postgres_bindir,
)
from loom_runtime import Handle, Loom
from loom_runtime.testing import ChildProcess

from loom_core import EventKind, JsonValue, StorageError

DEADLINE: Final = 180.0
"""Seconds any wait for an observable condition may take before the test fails (the pool
reconnects with a backoff that grows to about the outage's length, and a stranded run is
taken back up to 30 s apart)."""
WITHSTANDS: Final = 60.0
"""The store's reconnect_timeout where the worker is to ride a restart out: far longer
than a restart takes."""
GIVES_UP: Final = 1.0
"""The store's reconnect_timeout where an outage is to outlast it."""
NOTE: Final[JsonValue] = {"note": "go"}
BUSY: Final = 8
"""Executions started, their gates open and their messages sent, just before the database
goes: wherever their runs are when it goes (a write in flight, a wake being fired), they
must come through as the three held ones do."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    """A server this module may stop, restart and disturb without touching the others."""
    if find_postgres_bindir() is None and not in_ci():
        pytest.skip("no PostgreSQL server binaries (under CI=true this fails instead)")
    with ThrowawayCluster() as started:
        yield started


async def _until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {DEADLINE:g} s")
        await asyncio.sleep(0.02)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@dataclass(slots=True)
class Scene:
    """One test's database, directory, worker process and client apps."""

    url: str
    directory: Path
    worker: ChildProcess
    client: Loom
    sender: Loom
    held: str = "held"
    sleeping: str = "sleeping"
    receiving: str = "receiving"

    busy: tuple[str, ...] = tuple(f"busy-{k}" for k in range(BUSY))

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.held, self.sleeping, self.receiving, *self.busy)

    def traces(self) -> list[list[str]]:
        return [line.split() for line in _lines(self.directory / outage_app.TRACE_FILE)]

    def reports(self) -> list[str]:
        return _lines(self.directory / outage_app.REPORTS_FILE)

    async def reported(self, hook: str, execution_id: str, times: int = 1) -> bool:
        found = [line for line in self.reports() if line.split()[:2] == [hook, execution_id]]
        return len(found) >= times

    def open_gate(self, execution_id: str, step: str) -> None:
        outage_app.gate(str(self.directory), execution_id, step).touch()

    async def started(self, execution_id: str, step: str) -> bool:
        return any(t[1:3] == [execution_id, step] for t in self.traces())

    async def parked_on(self, execution_id: str, call: str, steps: int) -> bool:
        view = await self.client.inspect(execution_id)
        log = await self.client.storage.events.read(execution_id)
        recorded = sum(1 for e in log if e.kind == EventKind.STEP_COMPLETED)
        return (
            view.status == "suspended"
            and recorded == steps
            and any(w.call == call for w in view.pending_waits())
        )


async def _worker(url: str, directory: Path, reconnect: float, name: str) -> ChildProcess:
    """``loom worker --app outage_app:app`` on ``url``, once it serves."""
    here = str(Path(outage_app.__file__).parent)
    env = {
        **os.environ,
        "LOOM_OUTAGE_URL": url,
        "LOOM_OUTAGE_DIR": str(directory),
        "LOOM_OUTAGE_RECONNECT": str(reconnect),
        "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    worker = await ChildProcess.spawn(
        sys.executable, "-m", "loom_runtime", "worker", "--app", "outage_app:app",
        stderr=directory / f"{name}.err", env=env,
    )

    async def serving() -> bool:
        if worker.returncode is not None:
            raise AssertionError(f"the worker exited: {worker.stderr_tail()}")
        return "loom worker: node" in worker.stderr_tail()

    await _until("serving", serving)
    return worker


async def _scene(
    cluster: ThrowawayCluster, tmp_path: Path, reconnect: float, query: str = ""
) -> Scene:
    url = PostgresServer(cluster.url, cluster).fresh_database("loom_outage") + query
    worker = await _worker(url, tmp_path, reconnect, "worker")
    client = outage_app.build(
        url, str(tmp_path), reconnect_timeout=reconnect, node="client", timers=False,
        recover=False,
    )
    sender = Loom(
        url, node="sender", options={"reconnect_timeout": reconnect}, timers=False,
        recover=False,
    )
    return Scene(url, tmp_path, worker, client, sender)


async def _hold_everywhere(scene: Scene) -> dict[str, Handle[Any]]:
    """Start the three executions and wait until one is held mid-step, one parked on its
    sleep and one parked on its receive."""
    directory = str(scene.directory)
    for execution_id in scene.ids:
        scene.open_gate(execution_id, "b")
        if execution_id != scene.held:
            scene.open_gate(execution_id, "a")
    handles = {
        scene.held: await scene.client.start(outage_app.WORKFLOW, directory, 0.05,
                                             id=scene.held),
        # Parked on its sleep from before the database goes until after it is back, as
        # long as the outage lasts less than this; if longer, it fires late.
        scene.sleeping: await scene.client.start(outage_app.WORKFLOW, directory, 2.0,
                                                 id=scene.sleeping),
        scene.receiving: await scene.client.start(outage_app.WORKFLOW, directory, 0.05,
                                                  id=scene.receiving),
    }
    await _until("held in step a", lambda: scene.started(scene.held, "a"))
    await _until("parked on its sleep", lambda: scene.parked_on(scene.sleeping, "sleep", 1))
    await _until("parked on its receive",
                 lambda: scene.parked_on(scene.receiving, "receive", 1))
    for execution_id in scene.busy:
        scene.open_gate(execution_id, "a")
        handles[execution_id] = await scene.client.start(
            outage_app.WORKFLOW, directory, 0.05, id=execution_id
        )
        await scene.sender.send(execution_id, outage_app.TOPIC, NOTE, key=f"go-{execution_id}")
    return handles


async def _results(scene: Scene, waiting: dict[str, asyncio.Task[Any]]) -> dict[str, Any]:
    """Each waiter's result; a waiter that got a typed error (and only a StorageError is
    one an outage explains) asks again, now that the database is back."""
    results: dict[str, Any] = {}
    for execution_id, task in waiting.items():
        try:
            results[execution_id] = await asyncio.wait_for(task, DEADLINE)
        except StorageError:
            results[execution_id] = await _again_after_storage_errors(
                functools.partial(scene.client.get(execution_id).result, DEADLINE)
            )
    return results


async def _check(
    scene: Scene, results: dict[str, Any], *, strict: bool, workers: set[int] | None = None
) -> None:
    """Every execution completed once, each step recorded once by the worker (one of
    ``workers``, the pids of the workers that served in turn), each effect run once
    (``strict``) or run again only after a run that left no record."""
    pids = workers if workers is not None else {scene.worker.pid}
    traces = scene.traces()
    for execution_id in scene.ids:
        log = await scene.client.storage.events.read(execution_id)
        assert [e.sequence for e in log] == list(range(len(log)))
        kinds = [e.kind for e in log]
        assert kinds.count(EventKind.EXECUTION_COMPLETED) == 1, (execution_id, kinds)
        assert kinds[-1] == EventKind.EXECUTION_COMPLETED
        assert EventKind.EXECUTION_FAILED not in kinds
        assert kinds.count(EventKind.MESSAGE_CONSUMED) == 1, (execution_id, kinds)
        recorded = [e.payload for e in log if e.kind == EventKind.STEP_COMPLETED]
        assert [r["name"] for r in recorded] == ["a", "b"], recorded  # type: ignore[index, call-overload]
        result = results[execution_id]
        assert result["note"] == NOTE
        for step in ("a", "b"):
            value = result[step]
            assert value["pid"] in pids, (execution_id, step, value)
            runs = [t for t in traces if t[1:3] == [execution_id, step]]
            tokens = [t[4] for t in runs]
            # The recorded run is the last one: nothing ran the step again after its record.
            assert tokens[-1] == value["token"], (execution_id, step, runs)
            if strict:
                assert len(runs) == 1, (execution_id, step, runs)
    untyped = [line for line in scene.reports() if line.split()[3] != "True"]
    assert not untyped, untyped
    assert scene.worker.returncode is None, scene.worker.stderr_tail()


async def _stop(scene: Scene) -> None:
    """SIGTERM the worker, as an operator stops it: it leaves cleanly."""
    os.kill(scene.worker.pid, signal.SIGTERM)
    assert await scene.worker.finish() == 0, scene.worker.stderr_tail()
    assert "loom worker: stopped" in scene.worker.stderr_tail()


async def _send_all(scene: Scene) -> None:
    """Send each receiver its message, under a key, again after a typed error (as a
    client that never heard back does): the key stores it once."""
    for execution_id in (scene.held, scene.sleeping, scene.receiving):
        await _again_after_storage_errors(
            functools.partial(
                scene.sender.send, execution_id, outage_app.TOPIC, NOTE,
                key=f"go-{execution_id}",
            )
        )


async def _again_after_storage_errors(call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()``, made again while it raises a StorageError (the store has not
    reconnected yet), until :data:`DEADLINE`."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return await call()
        except StorageError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _terminate_sessions(cluster: ThrowawayCluster, url: str) -> int:
    import psycopg  # type: ignore[import-not-found, unused-ignore]

    database = urlsplit(url).path.lstrip("/")
    async with await psycopg.AsyncConnection.connect(cluster.url, autocommit=True) as admin:
        cursor = await admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_restart_mid_step_sleep_and_receive_loses_and_repeats_nothing(
    cluster: ThrowawayCluster, tmp_path: Path, mode: str
) -> None:
    # fast: pg_ctl restart -m fast, sessions ended; immediate: the server crashes.
    scene = await _scene(cluster, tmp_path, WITHSTANDS)
    try:
        async with scene.client, scene.sender:
            handles = await _hold_everywhere(scene)
            waiting = {i: asyncio.create_task(h.result()) for i, h in handles.items()}
            await asyncio.to_thread(cluster.stop, mode)
            await asyncio.to_thread(cluster.start)
            scene.open_gate(scene.held, "a")
            await _send_all(scene)
            results = await _results(scene, waiting)
            await _check(scene, results, strict=True)
        await _stop(scene)
    finally:
        scene.worker.kill()


async def test_an_outage_longer_than_the_store_retries_is_reported_typed_and_outlived(
    cluster: ThrowawayCluster, tmp_path: Path
) -> None:
    scene = await _scene(cluster, tmp_path, GIVES_UP, "?connect_timeout=1")
    try:
        async with scene.client, scene.sender:
            handles = await _hold_everywhere(scene)
            waiting = {i: asyncio.create_task(h.result()) for i, h in handles.items()}
            await asyncio.to_thread(cluster.stop, "fast")
            try:
                # The held step ends while the server is down: its record cannot be written.
                scene.open_gate(scene.held, "a")
                with pytest.raises(StorageError):
                    await scene.sender.send(scene.receiving, outage_app.TOPIC, NOTE,
                                            key=f"go-{scene.receiving}")
                done, _ = await asyncio.wait(waiting.values(), timeout=DEADLINE)
                assert done == set(waiting.values()), "a result() caller hung"
                for task in done:  # the result, or a typed error
                    error = task.exception()
                    assert error is None or isinstance(error, StorageError), task
                await _until(
                    "reported the held step's lost record",
                    lambda: scene.reported("on_storage_error", scene.held),
                )
                # Down for longer than connect_timeout (1 s in the URL): the worker's
                # timer service fails each poll, and reports the first of them.
                await _until("reported the outage", lambda: scene.reported("on_error", "-"))
            finally:
                await asyncio.to_thread(cluster.start)
            await _send_all(scene)
            results = await _results(scene, waiting)
            await _check(scene, results, strict=False)
            # The held step's run that ended in the outage left no record; it ran again.
            assert [t[1:3] for t in scene.traces()].count([scene.held, "a"]) == 2
        await _stop(scene)
    finally:
        scene.worker.kill()


async def test_terminated_sessions_lose_and_repeat_nothing(
    cluster: ThrowawayCluster, tmp_path: Path
) -> None:
    scene = await _scene(cluster, tmp_path, WITHSTANDS)
    try:
        async with scene.client, scene.sender:
            handles = await _hold_everywhere(scene)
            waiting = {i: asyncio.create_task(h.result()) for i, h in handles.items()}
            # The worker's, the client's and the sender's: every session of the database.
            assert await _terminate_sessions(cluster, scene.url) > 0
            scene.open_gate(scene.held, "a")
            await _send_all(scene)
            results = await _results(scene, waiting)
            await _check(scene, results, strict=True)
        await _stop(scene)
    finally:
        scene.worker.kill()


async def test_a_worker_stopped_while_the_database_is_down_leaves_and_its_successor_finishes(
    cluster: ThrowawayCluster, tmp_path: Path
) -> None:
    scene = await _scene(cluster, tmp_path, GIVES_UP, "?connect_timeout=1")
    first = scene.worker.pid
    try:
        async with scene.client, scene.sender:
            handles = await _hold_everywhere(scene)
            await asyncio.to_thread(cluster.stop, "fast")
            try:
                scene.open_gate(scene.held, "a")
                await _until(
                    "reported the held step's lost record",
                    lambda: scene.reported("on_storage_error", scene.held),
                )
                # SIGTERM while its calls fail: it leaves, exit code 0, nothing hung.
                await _stop(scene)
            finally:
                await asyncio.to_thread(cluster.start)
            # The next worker of the same node carries on what the first was running.
            scene.worker = await _worker(scene.url, tmp_path, GIVES_UP, "worker-2")
            await _send_all(scene)
            results = await _results(
                scene, {i: asyncio.create_task(h.result()) for i, h in handles.items()}
            )
            await _check(scene, results, strict=False, workers={first, scene.worker.pid})
        await _stop(scene)
    finally:
        scene.worker.kill()
