"""A worker running workflows through crypto over the audit chain on SQLite, SIGKILLed in
the middle of a step: the next process recovers the execution and carries it on through
continue-as-new, and the chain of every log it wrote verifies; so it does once the
execution's streams are deleted and a new execution is started under the same id."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from loom_audit import verify
from loom_runtime import Loom
from stack_worker import worker_app

WORKER = Path(__file__).with_name("stack_worker.py")
STREAMS = ("order-1", "$inbox:order-1", "order-1#1", "$inbox:order-1#1")


async def kill_in_the_stall(database: Path, keys: Path) -> str:
    """Run the worker until its second step stalls, SIGKILL it; the step's label."""
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), str(database), str(keys),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert worker.stdout is not None
    try:
        async with asyncio.timeout(60):
            label = (await worker.stdout.readline()).decode().strip()
    finally:
        if worker.returncode is None:
            worker.send_signal(signal.SIGKILL)
        _, err = await worker.communicate()
    assert worker.returncode == -signal.SIGKILL, err.decode()
    return label


async def chains(app: Loom) -> dict[str, bool]:
    ids = await app.storage.events.list_executions()
    return {i: (await verify(app.storage, i)).ok for i in ids}


async def test_the_chain_of_every_log_verifies_after_a_sigkill_and_after_the_id_is_reused(
    tmp_path: Path,
) -> None:
    database, keys = tmp_path / "loom.db", tmp_path / "keys"
    assert await kill_in_the_stall(database, keys) == "b0"

    app = worker_app(database, keys, recover=False)
    async with app:
        (taken,) = await app.recover()
        assert taken.execution_id == "order-1"
        await app.drain()
        await app.send("order-1", "go", {"card": "5500"})
        assert await taken.result(timeout=10) == {"card": "5500"}
        assert await chains(app) == dict.fromkeys(sorted(STREAMS), True)

        for stream in STREAMS:
            assert await app.storage.events.delete_execution(stream)
        again = await app.start("flow", 0, id="order-1")
        await app.drain()
        await app.send("order-1", "go", 1)
        await app.drain()
        await app.send("order-1", "go", 2)
        assert await again.result(timeout=10) == 2
        assert await chains(app) == dict.fromkeys(sorted(STREAMS), True)
