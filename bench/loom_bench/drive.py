"""Run ``count`` executions and time them: ``concurrency`` asyncio tasks, one thread, or a
pool of ``concurrency`` threads (for a synchronous library, driven as its users drive it).

Each worker takes the next execution index, runs it to the end and takes another, so
``concurrency`` executions are in flight until the last ones drain. The clock covers the
whole run (first start to last completion); each execution's own duration is its latency.

Just before the clock starts, the garbage collector runs once: what the warm-up and any
untimed setup left behind is collected then, not inside the timed run of whichever row
made more of it. The collector stays on while the clock runs, as it would in use.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from time import perf_counter
from typing import TypeVar

from loom_bench.statistics import Sample, sample_from

__all__ = [
    "RunPlan",
    "Tick",
    "drive_concurrently",
    "drive_sequentially",
    "drive_threads",
    "drive_workers",
]

W = TypeVar("W")

Tick = Callable[[], None]
"""Called once per completed execution (the progress display counts them)."""


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One timed run: ``executions`` at ``concurrency``, after ``warmup`` untimed ones.

    Execution ids are ``f"{prefix}-{n}"`` (``f"{prefix}-w{n}"`` for the warm-up), so no
    two runs of a benchmark ever write the same execution.
    """

    executions: int
    concurrency: int
    warmup: int
    prefix: str

    def execution_id(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def warmup_id(self, index: int) -> str:
        return f"{self.prefix}-w{index}"


def _noop() -> None:
    return None


async def drive_concurrently(
    count: int,
    concurrency: int,
    execute: Callable[[int], Awaitable[None]],
    tick: Tick = _noop,
) -> Sample:
    """Run ``execute(0)`` … ``execute(count - 1)`` with ``concurrency`` in flight.

    The first failure cancels the other workers and is raised as itself (not wrapped in
    an exception group): a benchmark run either completes every execution or fails.
    """
    _check(count, concurrency)

    async def run(_worker: int, index: int) -> None:
        await execute(index)

    return await drive_workers(count, range(concurrency), run, tick)


async def drive_workers(
    count: int,
    workers: Sequence[W],
    execute: Callable[[W, int], Awaitable[None]],
    tick: Tick = _noop,
) -> Sample:
    """Like :func:`drive_concurrently`, one task per item of ``workers`` (e.g. one
    connection each), which is handed to every execution that task runs."""
    _check(count, len(workers))
    latencies: list[float] = []
    next_index = 0

    async def worker(own: W) -> None:
        nonlocal next_index
        while next_index < count:
            index = next_index
            next_index += 1
            began = perf_counter()
            await execute(own, index)
            latencies.append(perf_counter() - began)
            tick()

    gc.collect()
    started = perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for own in workers[:count]:
                group.create_task(worker(own))
    except BaseExceptionGroup as failed:
        raise _first(failed) from None
    return sample_from(latencies, perf_counter() - started)


def drive_sequentially(
    count: int, execute: Callable[[int], None], tick: Tick = _noop
) -> Sample:
    """Run ``execute(0)`` … ``execute(count - 1)`` one after another in this thread."""
    _check(count, 1)
    latencies: list[float] = []
    gc.collect()
    started = perf_counter()
    for index in range(count):
        began = perf_counter()
        execute(index)
        latencies.append(perf_counter() - began)
        tick()
    return sample_from(latencies, perf_counter() - started)


def drive_threads(
    count: int, concurrency: int, execute: Callable[[int], None], tick: Tick = _noop
) -> Sample:
    """Run ``execute(0)`` … ``execute(count - 1)`` on a pool of ``concurrency`` threads,
    each taking the next index as it finishes one, so ``concurrency`` are in flight until
    the last ones drain (as :func:`drive_concurrently` does with tasks).

    The threads are started before the clock (they wait at a barrier), and ``tick`` is
    called under a lock, one thread at a time. The first failure stops the other threads
    taking more work and is raised as itself once they have finished.
    """
    _check(count, concurrency)
    workers = min(concurrency, count)
    lock = threading.Lock()
    latencies: list[float] = []
    next_index = 0
    stop = threading.Event()
    start = threading.Barrier(workers + 1)

    def worker() -> None:
        nonlocal next_index
        start.wait()
        while not stop.is_set():
            with lock:
                index = next_index
                next_index += 1
            if index >= count:
                return
            began = perf_counter()
            try:
                execute(index)
            except BaseException:
                stop.set()
                raise
            elapsed = perf_counter() - began
            with lock:
                latencies.append(elapsed)
                tick()

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-driver") as pool:
        futures = [pool.submit(worker) for _ in range(workers)]
        gc.collect()
        start.wait()
        started = perf_counter()
        wait(futures)
        seconds = perf_counter() - started
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return sample_from(latencies, seconds)


def _check(count: int, concurrency: int) -> None:
    if count < 1:
        raise ValueError(f"a run needs at least one execution, got {count}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
