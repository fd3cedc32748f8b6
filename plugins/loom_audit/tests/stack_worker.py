"""A worker for ``test_audit_stack_process_deaths``: a workflow through crypto over the
audit chain on SQLite. Run as a script, it starts ``order-1``, sends it its message and is
left in the second step, which prints the step's label and waits for ever (for the
SIGKILL); imported, :func:`worker_app` is the same app, whose step does not stall.

``python stack_worker.py DATABASE KEYS``
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from loom_crypto import FileKeyStore
from loom_runtime import Context, Loom, execution_subject

STALLING: list[bool] = []
"""Not empty in the worker process, whose second step stalls."""


async def record(label: str) -> str:
    return label.upper()


async def stall(label: str) -> str:
    if STALLING:
        print(label, flush=True)
        await asyncio.Event().wait()
    return label


async def flow(ctx: Context, generation: int) -> object:
    await ctx.step(record, f"a{generation}")
    value = await ctx.receive("go")
    await ctx.step(stall, f"b{generation}")
    if generation == 0:
        ctx.continue_as_new(1)
    return value


def worker_app(database: Path, keys: Path, *, recover: bool = True) -> Loom:
    app = Loom(
        f"sqlite:///{database}", node="worker", recover=recover,
        decorators=["audit", ("crypto", {"key_store": FileKeyStore(keys),
                                         "subject_of": execution_subject})],
    )
    app.workflow(name="flow")(flow)
    return app


async def main(database: Path, keys: Path) -> None:
    async with worker_app(database, keys) as app:
        await app.start("flow", 0, id="order-1")
        await app.send("order-1", "go", {"card": "4111"})
        await asyncio.Event().wait()


if __name__ == "__main__":
    STALLING.append(True)
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
