"""Several real processes on one SQLite file: two ``loom worker`` processes and a client.

What a user running a few workers beside a web process on one host sees when a tool
holds the file's write lock past ``busy_timeout_ms``, when a ``sqlite3`` shell keeps a
read transaction open meanwhile, and when a worker is SIGKILLed in the middle of a step.
Nothing is left to the scheduler: the test holds the lock until the workers have reported
that it made them fail, holds a step on a gate file until it has killed the worker
running it, and waits for what it checks in files and in the log, never for a time. The
app is ``outage_app``'s: each step writes a line to a trace file outside Loom, so the
test counts how often each step's effect ran.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Final

import outage_app
import pytest
from loom_runtime import Loom
from loom_runtime.testing import ChildProcess

from loom_core import EventKind

DEADLINE: Final = 120.0
"""Seconds any wait for an observable condition may take before the test fails."""
BUSY_MS: Final = 300
"""The workers' busy_timeout_ms: the lock the test holds outlasts it, whatever the machine."""
COUNT: Final = 6


async def _until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {DEADLINE:g} s")
        await asyncio.sleep(0.02)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def _worker(url: str, directory: Path, node: str, busy_ms: int) -> ChildProcess:
    """``loom worker --app outage_app:app --node <node>`` on ``url``, once it serves."""
    here = str(Path(outage_app.__file__).parent)
    env = {
        **os.environ,
        "LOOM_OUTAGE_URL": url,
        "LOOM_OUTAGE_DIR": str(directory),
        "LOOM_OUTAGE_BUSY_MS": str(busy_ms),
        "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    worker = await ChildProcess.spawn(
        sys.executable, "-m", "loom_runtime", "worker", "--app", "outage_app:app",
        "--node", node, stderr=directory / f"{node}-{time.monotonic_ns()}.err", env=env,
    )

    async def serving() -> bool:
        if worker.returncode is not None:
            raise AssertionError(f"the worker exited: {worker.stderr_tail()}")
        return f"loom worker: node '{node}'" in worker.stderr_tail()

    await _until(f"{node} serving", serving)
    return worker


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Loom]:
    """The process that starts and sends (timers off: the workers fire every wake)."""
    app = outage_app.build(
        f"sqlite:///{tmp_path / 'loom.db'}", str(tmp_path), node="client", timers=False,
        recover=False,
    )
    async with app:
        yield app


async def _all_completed(client: Loom, ids: list[str]) -> bool:
    for execution_id in ids:
        if (await client.inspect(execution_id)).status != "completed":
            return False
    return True


async def _check_logs(client: Loom, ids: list[str]) -> None:
    """Each execution completed once, with each of its steps recorded once."""
    for execution_id in ids:
        kinds = Counter(e.kind for e in await client.storage.events.read(execution_id))
        assert kinds[EventKind.EXECUTION_COMPLETED] == 1, (execution_id, kinds)
        assert kinds[EventKind.STEP_COMPLETED] == 2, (execution_id, kinds)


def _no_untyped_failure(directory: Path) -> None:
    for err in directory.glob("*.err"):
        text = err.read_text(errors="replace")
        assert "Traceback" not in text, (err, text)
        assert "database is locked" not in text, (err, text)


async def test_a_lock_held_past_busy_timeout_is_reported_typed_and_a_long_reader_loses_nothing(
    tmp_path: Path, client: Loom
) -> None:
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    workers = [await _worker(url, tmp_path, f"w-{k}", BUSY_MS) for k in range(2)]
    ids = [f"locked-{k}" for k in range(COUNT)]
    for execution_id in ids:
        for step in ("a", "b"):
            outage_app.gate(str(tmp_path), execution_id, step).touch()
    reader = sqlite3.connect(tmp_path / "loom.db", isolation_level=None)
    locker = sqlite3.connect(tmp_path / "loom.db", isolation_level=None, timeout=DEADLINE)
    try:
        # Parked on their first sleep in the client; only a worker's write wakes them.
        for execution_id in ids:
            await client.start(outage_app.WORKFLOW, str(tmp_path), 0.05, id=execution_id)
        await client.drain()  # every run parked: only the workers write while it is locked
        reader.execute("BEGIN")
        seen = reader.execute("SELECT count(*) FROM loom_events").fetchone()[0]
        locker.execute("BEGIN IMMEDIATE")  # what a sqlite3 shell's BEGIN IMMEDIATE holds

        async def both_failed() -> bool:
            return len(_lines(tmp_path / outage_app.REPORTS_FILE)) >= 2

        await _until("reported busy", both_failed)
        assert not any(t.split()[1] in ids for t in _lines(tmp_path / outage_app.TRACE_FILE))
        locker.execute("ROLLBACK")
        for execution_id in ids:
            await client.send(execution_id, outage_app.TOPIC, "go", key="go")
        await _until("completed", lambda: _all_completed(client, ids))
        # The reader still sees the file as it was when it began, then all of it.
        assert reader.execute("SELECT count(*) FROM loom_events").fetchone()[0] == seen
        reader.execute("COMMIT")
        assert reader.execute("SELECT count(*) FROM loom_events").fetchone()[0] > seen
    finally:
        locker.close()
        reader.close()
        for worker in workers:
            worker.kill()
            await worker.finish()
    await _check_logs(client, ids)
    reports = _lines(tmp_path / outage_app.REPORTS_FILE)
    for line in reports:
        assert line.split()[2:4] == ["DatabaseBusyError", "True"], line
        assert f"busy_timeout_ms={BUSY_MS}" in line, line
        assert "nothing was written" in line, line
    # A step runs again only where a failed write stopped its run, which the hook reported.
    stopped = {line.split()[1] for line in reports if line.startswith("on_storage_error")}
    runs = Counter(tuple(t.split()[1:3]) for t in _lines(tmp_path / outage_app.TRACE_FILE))
    for execution_id in ids:
        for step in ("a", "b"):
            assert runs[(execution_id, step)] == 1 or (
                runs[(execution_id, step)] > 1 and execution_id in stopped
            ), (execution_id, step, runs)
    _no_untyped_failure(tmp_path)


async def test_a_worker_sigkilled_mid_step_on_a_shared_file_is_carried_on_by_its_node(
    tmp_path: Path, client: Loom
) -> None:
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    workers = {f"w-{k}": await _worker(url, tmp_path, f"w-{k}", 5000) for k in range(2)}
    held, ids = "held", ["held", *(f"free-{k}" for k in range(COUNT - 1))]
    for execution_id in ids:
        outage_app.gate(str(tmp_path), execution_id, "b").touch()
        if execution_id != held:
            outage_app.gate(str(tmp_path), execution_id, "a").touch()
    killed: set[int] = set()
    try:
        for execution_id in ids:
            await client.start(outage_app.WORKFLOW, str(tmp_path), 0.05, id=execution_id)

        async def held_in_a() -> bool:
            return any(t.split()[1:3] == [held, "a"]
                       for t in _lines(tmp_path / outage_app.TRACE_FILE))

        await _until("held in step a", held_in_a)
        pid = next(int(t.split()[3]) for t in _lines(tmp_path / outage_app.TRACE_FILE)
                   if t.split()[1:3] == [held, "a"])
        node = next(name for name, w in workers.items() if w.pid == pid)
        workers[node].kill()
        assert await workers[node].finish() < 0
        killed.add(pid)
        workers[node] = await _worker(url, tmp_path, node, 5000)
        outage_app.gate(str(tmp_path), held, "a").touch()
        for execution_id in ids:
            await client.send(execution_id, outage_app.TOPIC, "go", key="go")
        await _until("completed", lambda: _all_completed(client, ids))
    finally:
        for worker in workers.values():
            worker.kill()
            await worker.finish()
    await _check_logs(client, ids)
    traces = [t.split() for t in _lines(tmp_path / outage_app.TRACE_FILE)]
    runs = Counter((t[1], t[2]) for t in traces)
    assert runs[(held, "a")] == 2  # the killed run's, and its node's next start's
    # Elsewhere a step ran twice only if the killed worker was running it too.
    for (execution_id, step), n in runs.items():
        assert n == 1 or any(
            t[1:3] == [execution_id, step] and int(t[3]) in killed for t in traces
        ), (execution_id, step, n)
    assert _lines(tmp_path / outage_app.REPORTS_FILE) == []
    _no_untyped_failure(tmp_path)
