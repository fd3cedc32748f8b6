"""The workflow rows' cost in CPU instructions: ``python3 -m loom_bench.instructions``.

Throughput on a shared two-core machine moves with whatever else runs on it; the number of
instructions a workflow costs does not. This counts them with valgrind's callgrind (which
counts executed instructions, not time, and runs threads one at a time): a child process
runs ``small`` executions of a workflow (or of its twin, the store making the same calls,
see :mod:`loom_bench.workflows`) at 64 concurrent on a fresh storage, another runs
``large``, and the difference over ``large - small`` executions is one execution's cost,
start-up and warm-up cancelled out. twin / runtime is the counterpart, free of noise, of
the throughput rows' runtime / store.

A third count runs the twin in a task of its own per execution, made and awaited as a
background start must (``app.start`` returns before the body runs): twin / that is the
most runtime / store can be for any runtime that drives a workflow in the background. A
fourth runs the workflow through ``app.execute``, which drives the body in the calling
task, so that bound does not hold for it.

It says nothing about waiting (a disk, a server): on SQLite it counts the store's thread
too, on PostgreSQL only the client's side. With ``--loop-thread`` it counts only the thread
that runs the event loop: on SQLite the store's writer thread works beside that thread, so
when the loop's thread is the one that is busy, its count is what throughput follows.
Valgrind must be installed (``valgrind`` on ``PATH``); each count runs the workflows about
fifty times slower than natively.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from loom_bench.drive import drive_concurrently
from loom_bench.workflows import (
    WORKFLOWS,
    Execute,
    WorkflowScenario,
    runtime_executor,
    twin_executor,
)
from loom_core import Storage, open_storage

__all__ = ["Count", "Side", "count_instructions", "main", "per_execution", "run_executions"]

Side = Literal["runtime", "twin", "task", "execute"]
SIDES: Final[tuple[Side, ...]] = ("runtime", "twin", "task", "execute")
CONCURRENCY: Final = 64
_COLLECTED: Final = re.compile(r"Collected\s*:\s*(\d+)")
_SUMMARY: Final = re.compile(r"^summary:\s*(\d+)", re.MULTILINE)


async def run_executions(side: Side, scenario: str, executions: int, url: str) -> None:
    """Run ``executions`` of ``scenario`` through the runtime (``app.start`` or, for the
    side ``execute``, ``app.execute``), as its twin, or as its twin in a task of its own
    per execution, on a fresh storage at ``url``, 64 at a time (what each counted child
    process does)."""
    workflow = WORKFLOWS[scenario]
    async with open_storage(url) as storage, _executor(side, storage, workflow) as execute:
        loop = asyncio.get_running_loop()

        async def one(index: int) -> None:
            execution = execute(f"{side}-{index}")
            if side == "task":
                assert asyncio.iscoroutine(execution)
                await loop.create_task(execution)
            else:
                await execution

        await drive_concurrently(executions, CONCURRENCY, one)


def _executor(
    side: Side, storage: Storage, workflow: WorkflowScenario
) -> contextlib.AbstractAsyncContextManager[Execute]:
    if side == "runtime":
        return runtime_executor(storage, workflow)
    if side == "execute":
        return runtime_executor(storage, workflow, "execute")
    return twin_executor(storage, workflow)


def per_execution(small: int, large: int, at_small: int, at_large: int) -> int:
    """One execution's instructions, from the counts of two runs of different sizes."""
    if not 0 < small < large:
        raise ValueError(f"need 0 < small < large, not {small} and {large}")
    return round((at_large - at_small) / (large - small))


@dataclass(frozen=True, slots=True)
class Count:
    scenario: str
    backend: str
    runtime: int
    twin: int
    task: int
    execute: int

    @property
    def ratio(self) -> float:
        """twin / runtime: what the throughput rows' runtime / store would be if both
        sides were bound by this process's CPU alone."""
        return self.twin / self.runtime

    @property
    def ceiling(self) -> float:
        """twin / twin-in-a-task: the most :attr:`ratio` can be for a runtime that drives
        each workflow in a task of its own."""
        return self.twin / self.task

    @property
    def execute_ratio(self) -> float:
        """twin / the runtime through ``app.execute``."""
        return self.twin / self.execute


def _url(backend: str, directory: Path, name: str) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{directory / f'{name}.db'}"
    raise ValueError(f"counted backends are memory and sqlite, not {backend!r}")


def _collected(valgrind_output: str) -> int:
    found = _COLLECTED.search(valgrind_output)
    if found is None:
        raise RuntimeError(f"valgrind printed no instruction count:\n{valgrind_output[-2000:]}")
    return int(found.group(1))


def _loop_thread_count(out_file: Path) -> int:
    """The instructions of thread 1 (the one that ran ``asyncio.run``) in the per-thread
    files callgrind writes for ``--separate-threads=yes`` (``<out_file>-01``, ...)."""
    first = out_file.with_name(f"{out_file.name}-01")
    try:
        text = first.read_text()
    except OSError as exc:
        raise RuntimeError(f"callgrind wrote no count for the loop's thread: {exc}") from exc
    found = _SUMMARY.search(text)
    if found is None:
        raise RuntimeError(f"{first} has no summary line")
    return int(found.group(1))


def count_instructions(
    scenario: str,
    backend: str,
    *,
    small: int = 200,
    large: int = 1200,
    loop_thread: bool = False,
) -> Count:
    """Count one execution of ``scenario`` on ``backend``, through the runtime (started,
    and executed in place), as its twin and as its twin in a task (eight valgrind runs);
    with ``loop_thread``, only the instructions of the event loop's thread."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not on PATH (e.g. apt-get install valgrind)")
    totals: dict[tuple[Side, int], int] = {}
    with tempfile.TemporaryDirectory(prefix="loom-instructions-") as tmp:
        directory = Path(tmp)
        for side in SIDES:
            for executions in (small, large):
                url = _url(backend, directory, f"{side}-{executions}")
                out_file = directory / f"callgrind-{side}-{executions}"
                output = (
                    [f"--callgrind-out-file={out_file}", "--separate-threads=yes"]
                    if loop_thread
                    else ["--callgrind-out-file=/dev/null"]
                )
                done = subprocess.run(
                    [
                        valgrind, "--tool=callgrind", *output,
                        sys.executable, "-m", "loom_bench.instructions", "--child",
                        side, scenario, str(executions), url,
                    ],
                    capture_output=True, text=True, check=False,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"the counted run failed:\n{done.stderr[-2000:]}")
                totals[side, executions] = (
                    _loop_thread_count(out_file) if loop_thread else _collected(done.stderr)
                )
    runtime, twin, task, execute = (
        per_execution(small, large, totals[side, small], totals[side, large])
        for side in SIDES
    )
    return Count(scenario, backend, runtime, twin, task, execute)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m loom_bench.instructions",
        description="Instructions per workflow, through the runtime and as its twin "
        "(valgrind's callgrind; deterministic, unlike throughput).",
    )
    parser.add_argument("--backends", default="memory,sqlite")
    parser.add_argument("--scenarios", default=",".join(WORKFLOWS))
    parser.add_argument(
        "--loop-thread", action="store_true",
        help="count only the event loop's thread (not a store's writer thread)",
    )
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=1200)
    parser.add_argument("--child", nargs=4, metavar=("SIDE", "SCENARIO", "N", "URL"))
    args = parser.parse_args(argv)
    if args.child is not None:
        side, scenario, executions, url = args.child
        asyncio.run(run_executions(side, scenario, int(executions), url))
        return 0
    if args.loop_thread:
        print("Instructions of the event loop's thread only.\n")
    print(
        "| workflow | backend | runtime: instructions | store, same calls | runtime / store "
        "| store, in a task each | the most runtime / store can be "
        "| through app.execute | execute / store |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for backend in args.backends.split(","):
        for scenario in args.scenarios.split(","):
            count = count_instructions(
                scenario, backend, small=args.small, large=args.large,
                loop_thread=args.loop_thread,
            )
            print(
                f"| {WORKFLOWS[scenario].title} | {backend} | {count.runtime:,} | "
                f"{count.twin:,} | {count.ratio:.2f}x | {count.task:,} | "
                f"{count.ceiling:.2f}x | {count.execute:,} | {count.execute_ratio:.2f}x |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
