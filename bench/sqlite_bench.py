"""loom-sqlite throughput against a raw ``sqlite3`` loop doing the same writes.

Five workloads, each an execution's life:

- ``short``: start, one step, complete (three appends);
- ``short-fenced``: acquire_fence, then the same three appends under the token;
- ``park``: start, park (EXECUTION_SUSPENDED), resume, complete (four appends);
- ``park-fenced``: acquire, start, park, acquire again, resume, complete, fenced;
- ``park-fence-if``: acquire, start, park, then acquire_fence_if on the park and resume,
  complete under the token it returns.

The store runs ``--concurrency`` executions at a time (the way a runtime drives it); the
raw loop runs the same SQL (the store's own statements: head and fence check, inserts,
head upsert, fence bump, the answered-park scan), one transaction per store call,
sequentially, with plain ``sqlite3`` on the same kind of fresh file, in the same process
and run. The ratio is store / raw. Each figure is the median of ``--repeat`` runs, store
and raw interleaved. ``--quick`` is a smoke run (small and noisy).

    python bench/sqlite_bench.py            # the figures in docs/benchmarks.md
    python bench/sqlite_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from loom_sqlite import events as sql
from loom_sqlite import fencing
from loom_sqlite.clock import to_micros
from loom_sqlite.schema import ensure_schema

from loom_core import FenceAcquired, JsonObject, JsonValue, NewEvent, Storage, open_storage
from loom_core.validation import canonical_json

PAYLOAD: JsonValue = {"order": 42, "lines": [{"sku": "A-1", "qty": 2}], "note": "benchmark"}


# -- the store ------------------------------------------------------------------------------


async def short(storage: Storage, eid: str, fenced: bool) -> None:
    events = storage.events
    token = await events.acquire_fence(eid) if fenced else None
    for seq, kind in enumerate(("EXECUTION_STARTED", "STEP_COMPLETED", "EXECUTION_COMPLETED")):
        await events.append(eid, [NewEvent(kind, PAYLOAD)], expected_sequence=seq, fence=token)


async def park(storage: Storage, eid: str, mode: str) -> None:
    events = storage.events
    token = await events.acquire_fence(eid) if mode != "unfenced" else None
    await events.append(eid, [NewEvent("EXECUTION_STARTED", PAYLOAD)], expected_sequence=0,
                        fence=token)
    await events.append(eid, [NewEvent("EXECUTION_SUSPENDED", PAYLOAD)], expected_sequence=1,
                        fence=token)
    if mode == "fenced":
        token = await events.acquire_fence(eid)
    elif mode == "fence-if":
        assert token is not None
        result = await events.acquire_fence_if(eid, fence=token, park_seq=1)
        assert isinstance(result, FenceAcquired)
        token = result.fence
    await events.append(eid, [NewEvent("EXECUTION_RESUMED", PAYLOAD)], expected_sequence=2,
                        fence=token)
    await events.append(eid, [NewEvent("EXECUTION_COMPLETED", PAYLOAD)], expected_sequence=3,
                        fence=token)


Scenario = Callable[[Storage, str], Awaitable[None]]
SCENARIOS: dict[str, Scenario] = {
    "short": lambda s, e: short(s, e, False),
    "short-fenced": lambda s, e: short(s, e, True),
    "park": lambda s, e: park(s, e, "unfenced"),
    "park-fenced": lambda s, e: park(s, e, "fenced"),
    "park-fence-if": lambda s, e: park(s, e, "fence-if"),
}


async def run_store(
    path: str, name: str, executions: int, concurrency: int, synchronous: str = "NORMAL"
) -> float:
    scenario = SCENARIOS[name]
    async with open_storage("sqlite:///" + path, options={"synchronous": synchronous}) as storage:
        counter = iter(range(executions))

        async def worker() -> None:
            for i in counter:
                await scenario(storage, f"exec-{i:07d}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return executions / (time.perf_counter() - start)


# -- the raw loop: the same statements with plain sqlite3 ---------------------------------


def raw_append(raw: sqlite3.Connection, eid: str, seq: int, kind: str, token: int | None) -> None:
    metadata: JsonObject = {} if token is None else {"fence": token}
    raw.execute("BEGIN IMMEDIATE")
    head, current = raw.execute(fencing.SELECT_STATE, (eid,)).fetchone()
    if (head or 0) != seq or (token is not None and token < (current or 0)):
        raise AssertionError("the raw loop's writes conflicted")
    raw.execute(
        sql.INSERT_EVENT,
        (eid, seq, kind, canonical_json(PAYLOAD), canonical_json(metadata),
         to_micros(datetime.now(UTC))),
    )
    raw.execute(sql.UPSERT_HEAD, (eid, seq + 1))
    raw.execute("COMMIT")


def raw_acquire(raw: sqlite3.Connection, eid: str) -> int:
    raw.execute("BEGIN IMMEDIATE")
    token = fencing.acquire(raw, eid)
    raw.execute("COMMIT")
    return token


def raw_acquire_if(raw: sqlite3.Connection, eid: str, fence: int, park_seq: int) -> int:
    raw.execute("BEGIN IMMEDIATE")
    result = fencing.acquire_if(raw, eid, fence, park_seq)
    raw.execute("COMMIT")
    assert isinstance(result, FenceAcquired)
    return result.fence


def raw_scenario(raw: sqlite3.Connection, name: str, eid: str) -> None:
    if name.startswith("short"):
        token = raw_acquire(raw, eid) if name == "short-fenced" else None
        for seq, kind in enumerate(("EXECUTION_STARTED", "STEP_COMPLETED", "EXECUTION_COMPLETED")):
            raw_append(raw, eid, seq, kind, token)
        return
    token = raw_acquire(raw, eid) if name != "park" else None
    raw_append(raw, eid, 0, "EXECUTION_STARTED", token)
    raw_append(raw, eid, 1, "EXECUTION_SUSPENDED", token)
    if name == "park-fenced":
        token = raw_acquire(raw, eid)
    elif name == "park-fence-if":
        assert token is not None
        token = raw_acquire_if(raw, eid, token, 1)
    raw_append(raw, eid, 2, "EXECUTION_RESUMED", token)
    raw_append(raw, eid, 3, "EXECUTION_COMPLETED", token)


SYNCHRONOUS = {"NORMAL": "PRAGMA synchronous = NORMAL", "FULL": "PRAGMA synchronous = FULL"}


def run_raw(path: str, name: str, executions: int, synchronous: str = "NORMAL") -> float:
    raw = sqlite3.connect(path, isolation_level=None, timeout=5)
    try:
        raw.execute("PRAGMA journal_mode = WAL")
        raw.execute(SYNCHRONOUS[synchronous])
        ensure_schema(raw)
        start = time.perf_counter()
        for i in range(executions):
            raw_scenario(raw, name, f"exec-{i:07d}")
        return executions / (time.perf_counter() - start)
    finally:
        raw.close()


# -- driver -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    concurrency: int
    store: float
    raw: float

    @property
    def ratio(self) -> float:
        return self.store / self.raw


def fresh(directory: str, label: str) -> str:
    path = os.path.join(directory, f"{label}.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return path


def measure(
    directory: str, name: str, executions: int, concurrency: int, repeat: int, synchronous: str
) -> Figure:
    stores, raws = [], []
    for round_ in range(repeat):
        raw_path = fresh(directory, f"raw-{name}-{round_}")
        raws.append(run_raw(raw_path, name, executions, synchronous))
        path = fresh(directory, f"store-{name}-{round_}")
        stores.append(asyncio.run(run_store(path, name, executions, concurrency, synchronous)))
    return Figure(name, concurrency, statistics.median(stores), statistics.median(raws))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small, single-round smoke run")
    parser.add_argument("--executions", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--sequential", action="store_true",
                        help="also measure one execution at a time (concurrency 1)")
    parser.add_argument("--synchronous", choices=("NORMAL", "FULL"), default="NORMAL")
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()
    executions = args.executions or (300 if args.quick else 3000)
    repeat = args.repeat or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        print(f"SQLite {sqlite3.sqlite_version}, synchronous={args.synchronous}, WAL; {executions} "
              f"executions per run, median of {repeat}")
        print(f"{'workload':<15} {'conc':>4} {'store exec/s':>13} {'raw exec/s':>11} "
              f"{'ratio':>6}")
        levels = [args.concurrency] + ([1] if args.sequential else [])
        for concurrency in levels:
            for name in SCENARIOS:
                figure = measure(
                    directory, name, executions, concurrency, repeat, args.synchronous
                )
                print(f"{figure.name:<15} {figure.concurrency:>4} {figure.store:>13.0f} "
                      f"{figure.raw:>11.0f} {figure.ratio:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
