"""A worker SIGKILLed while a step is being retried (see ``test_process_deaths_retries``).

Run as a script (``retry_kills.py URL MODE``), it starts the execution ``o-1`` of
:func:`checkout` on ``URL`` with a :class:`VirtualClock` that moves only when told: the
step's first attempt fails and is recorded, to be tried again 60 s later. In mode
``wait`` it says ``waiting`` and waits out that interval without end; in mode ``hang`` it
moves its clock on, and the second attempt says ``attempt 2`` and hangs. Either way the
test kills it there.
"""

from __future__ import annotations

import asyncio
import sys
import threading

from loom_runtime import Context, Loom, Retry, step_info
from loom_runtime.testing import VirtualClock

RETRY = Retry(attempts=3, initial_interval=60)
HANG = threading.Event()
"""Set in the worker in mode ``hang``: the second attempt then never returns."""


def charge(order: str) -> str:
    info = step_info()
    assert info is not None
    print(f"attempt {info.attempt}", flush=True)
    if info.attempt == 1:
        raise ConnectionError("gateway down")
    if HANG.is_set():
        threading.Event().wait()  # until the process is killed
    return f"charged {order} at attempt {info.attempt}"


async def checkout(ctx: Context, order: str) -> object:
    return await ctx.step(charge, order, name="charge", retry=RETRY)


def app_on(url: str, clock: VirtualClock) -> Loom:
    app = Loom(url, node="n", clock=clock)
    app.workflow(name="checkout")(checkout)
    return app


async def work(url: str, mode: str) -> None:
    clock = VirtualClock()
    async with app_on(url, clock) as app:
        await app.start("checkout", "o-1", id="o-1")
        await clock.advance(0)  # returns once the run waits out the interval
        if mode == "wait":
            print("waiting", flush=True)
        else:
            HANG.set()
            asyncio.get_running_loop().create_task(clock.advance(60))
        await asyncio.Event().wait()  # until the process is killed


if __name__ == "__main__":
    asyncio.run(work(sys.argv[1], sys.argv[2]))
