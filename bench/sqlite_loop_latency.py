"""How late the event loop's other tasks run while one writer writes to SQLite.

A ticker task sleeps 1 ms in a loop (``await asyncio.sleep(0.001)``) and records how late
each wake-up is; beside it one writer runs ``short`` executions (three appends each, one
after another) for ``--seconds``. Printed: the ticker's lateness (p50, p99, max) and the
writer's executions/s, for

- ``idle``: the ticker alone (what the machine gives a 1 ms sleep);
- ``loom``: the writer is our store, ``open_storage("sqlite:///...")``;
- ``sqlite3 on the loop``: the writer is the bench's raw floor (a plain ``sqlite3`` loop
  doing the same writes) called from the loop's own thread, yielding after each
  execution: what a store that ran every SQLite call on the loop would do to it.

``--slow-fsync-ms N`` makes every ``fsync``/``fdatasync`` of the process take N ms more
(an ``LD_PRELOAD`` shim compiled with the system C compiler, Linux only), standing in for
a slow disk: under ``synchronous=NORMAL`` SQLite syncs only when it checkpoints and when
it starts the ``-wal`` file over, under ``FULL`` at every commit.

    python3 bench/sqlite_loop_latency.py --seconds 5 --synchronous NORMAL --slow-fsync-ms 20

No figure here is a test: it is measured and printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from loom_bench.raw_sqlite import RawSqliteFloor
from loom_bench.scenarios import SCENARIOS, run_execution

from loom_core import open_storage

TICK = 0.001
SHORT = SCENARIOS["short"]
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
static int delay_us(void) { const char *v = getenv("LOOM_SLOW_FSYNC_US"); return v ? atoi(v) : 0; }
int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    usleep(delay_us());
    return real(fd);
}
int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    usleep(delay_us());
    return real(fd);
}
"""


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _measure(
    seconds: float, writer: Callable[[Callable[[], bool]], Awaitable[int]] | None
) -> tuple[list[float], int]:
    """The ticker's lateness (ms) for ``seconds``, and how many executions the writer did."""
    lateness: list[float] = []
    deadline = time.perf_counter() + seconds

    def running() -> bool:
        return time.perf_counter() < deadline

    async def ticker() -> None:
        while running():
            asked = time.perf_counter()
            await asyncio.sleep(TICK)
            lateness.append((time.perf_counter() - asked - TICK) * 1000)

    ticking = asyncio.create_task(ticker())
    done = await writer(running) if writer is not None else 0
    await ticking
    return lateness, done


def _loom_writer(url: str) -> Callable[[Callable[[], bool]], Awaitable[int]]:
    async def write(running: Callable[[], bool]) -> int:
        async with open_storage(url) as storage:
            count = 0
            while running():
                await run_execution(storage.events, f"loom-{count}", SHORT)
                count += 1
            return count

    return write


def _raw_on_loop(path: Path, synchronous: str) -> Callable[[Callable[[], bool]], Awaitable[int]]:
    async def write(running: Callable[[], bool]) -> int:
        floor = RawSqliteFloor(path, synchronous=synchronous)  # type: ignore[arg-type]
        try:
            count = 0
            while running():
                floor.run_execution(f"raw-{count}", SHORT)  # on the loop's own thread
                count += 1
                await asyncio.sleep(0)
            return count
        finally:
            floor.close()

    return write


def _reexec_with_shim(slow_ms: float) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("--slow-fsync-ms needs a C compiler (cc or gcc) on PATH")
    build = Path(tempfile.mkdtemp(prefix="loom-slow-fsync-"))
    (build / "shim.c").write_text(SHIM)
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(build / "shim.so"), str(build / "shim.c"),
         "-ldl"],
        check=True,
    )
    env = dict(os.environ, LD_PRELOAD=str(build / "shim.so"),
               LOOM_SLOW_FSYNC_US=str(int(slow_ms * 1000)))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


async def _main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="loom-loop-latency-"))
    results: dict[str, list[tuple[list[float], int]]] = {
        "idle": [], "loom": [], "sqlite3 on the loop": []
    }
    for run in range(args.runs):  # a fresh file per run for each writer
        url = f"sqlite:///{workdir}/loom-{run}.db?synchronous={args.synchronous}"
        sides: list[tuple[str, Callable[[Callable[[], bool]], Awaitable[int]] | None]] = [
            ("idle", None),
            ("loom", _loom_writer(url)),
            ("sqlite3 on the loop", _raw_on_loop(workdir / f"raw-{run}.db", args.synchronous)),
        ]
        for name, writer in sides:
            results[name].append(await _measure(args.seconds, writer))
    slow = os.environ.get("LOOM_SLOW_FSYNC_US")
    print(
        f"synchronous={args.synchronous}, fsync slowed by "
        f"{int(slow) / 1000 if slow else 0:g} ms, {args.runs} runs of {args.seconds:g} s each "
        "(median of the runs' figures)\n"
    )
    print("| writer | writer executions/s | ticks | ticker lateness p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        p50 = statistics.median(_percentile(late, 0.50) for late, _ in runs)
        p99 = statistics.median(_percentile(late, 0.99) for late, _ in runs)
        worst = statistics.median(max(late) for late, _ in runs)
        ticks = statistics.median(len(late) for late, _ in runs)
        rate = statistics.median(done / args.seconds for _, done in runs)
        shown = "none" if name == "idle" else f"{rate:,.0f}".replace(",", " ")
        print(f"| {name} | {shown} | {ticks:.0f} | {p50:.2f} | {p99:.2f} | {worst:.1f} |")
    shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--synchronous", choices=("NORMAL", "FULL"), default="NORMAL")
    parser.add_argument("--slow-fsync-ms", type=float, default=0.0)
    args = parser.parse_args()
    if args.slow_fsync_ms > 0 and "LOOM_SLOW_FSYNC_US" not in os.environ:
        _reexec_with_shim(args.slow_fsync_ms)
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
