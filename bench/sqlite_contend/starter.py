"""A starter process: starts executions ``<prefix>-<i>`` and sends each its message.

    python starter.py URL DIR NODE PREFIX FIRST COUNT

Idempotent, so it can be SIGKILLed and run again: starts use ``if_exists="attach"``,
sends a ``key=``. Prints ``done`` when every start and send returned.
"""

from __future__ import annotations

import asyncio
import random
import sys

import contend_app

from loom_core import LoomError


async def main(url: str, directory: str, node: str, prefix: str, first: int, count: int) -> None:
    app = contend_app.build(url, directory, node=node, timers=False, recover=True)
    rng = random.Random(f"{prefix}{first}")
    async with app:
        ids = [f"{prefix}-{i}" for i in range(first, first + count)]
        for execution_id in ids:
            while True:
                try:
                    await app.start(contend_app.WORKFLOW, directory, rng.uniform(0.0, 0.2),
                                    id=execution_id, if_exists="attach")
                    break
                except LoomError as error:
                    contend_app._report(directory, "starter-start", execution_id, error)
                    await asyncio.sleep(0.05)
        for execution_id in ids:
            while True:
                try:
                    await app.send(execution_id, contend_app.TOPIC, {"from": node},
                                   key=f"go-{execution_id}")
                    break
                except LoomError as error:
                    contend_app._report(directory, "starter-send", execution_id, error)
                    await asyncio.sleep(0.05)
        await app.drain()
    print("done", flush=True)


if __name__ == "__main__":
    url, directory, node, prefix, first, count = sys.argv[1:7]
    asyncio.run(main(url, directory, node, prefix, int(first), int(count)))
