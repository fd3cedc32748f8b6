"""loom-postgres throughput: short executions/s and park/resume/s at 1, 8 and 64
concurrent executions, against a raw psycopg loop running the same statements and
pgbench running the same three transactions, on the same server in the same run.

    python bench/postgres_bench.py                  # starts its own durable cluster
    python bench/postgres_bench.py --url postgresql://…  --seconds 5

Workloads (each "execution" is a fresh execution id):

* ``unfenced``: append EXECUTION_STARTED @0, STEP_COMPLETED @1, EXECUTION_COMPLETED @2
  (three transactions: the "short execution");
* ``fenced``: the same three appends carrying fence 1, on executions whose token 1 was
  acquired before the timed phase (so the guard reads a real fence row);
* ``park/acquire_fence``: STARTED @0, SUSPENDED @1, acquire_fence, RESUMED @2 and
  COMPLETED @3 under the new token (five transactions);
* ``park/acquire_fence_if``: the same with ``acquire_fence_if(fence=0, park_seq=1)``.

Clients: ``loom`` is PostgresEventStore (validation, group commit, results as Events);
``raw`` is a psycopg pool loop (one connection per concurrent execution, prepared
statements) sending the very statement the store sends for one write, one transaction
per write; ``pgbench`` (unfenced only) runs those three statements from a script with
``-M prepared``. The cluster runs with fsync on (DURABLE_SETTINGS).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from loom_conformance.postgres import DURABLE_SETTINGS, ThrowawayCluster, find_postgres_bindir
from loom_postgres.events import BATCH
from loom_postgres.schema import ANSWERING, ANSWERING_LITERAL, KERNEL, KERNEL_LITERAL
from psycopg_pool import AsyncConnectionPool

from loom_core import NewEvent, Storage, open_storage

RawPool = AsyncConnectionPool[psycopg.AsyncConnection[tuple[object, ...]]]
LEVELS = (1, 8, 64)
WORKLOADS = ("unfenced", "fenced", "park/acquire_fence", "park/acquire_fence_if")
FENCED_ROWS = 300_000


@dataclass
class Result:
    workload: str
    client: str
    concurrency: int
    executions: int
    seconds: float
    repeat: int = 0

    @property
    def rate(self) -> float:
        return self.executions / self.seconds if self.seconds else 0.0


# -- the loom client ------------------------------------------------------------------------


async def loom_execution(storage: Storage, workload: str, eid: str) -> None:
    ev = storage.events
    if workload in ("unfenced", "fenced"):
        fence = 1 if workload == "fenced" else None
        await ev.append(eid, [NewEvent("EXECUTION_STARTED", {"input": 1})],
                        expected_sequence=0, fence=fence)
        await ev.append(eid, [NewEvent("STEP_COMPLETED", {"step": "a", "result": 2})],
                        expected_sequence=1, fence=fence)
        await ev.append(eid, [NewEvent("EXECUTION_COMPLETED", {"output": 3})],
                        expected_sequence=2, fence=fence)
        return
    await ev.append(eid, [NewEvent("EXECUTION_STARTED", {"input": 1})], expected_sequence=0)
    await ev.append(eid, [NewEvent("EXECUTION_SUSPENDED", {"wait": "timer"})],
                    expected_sequence=1)
    if workload == "park/acquire_fence":
        token = await ev.acquire_fence(eid)
    else:
        result = await ev.acquire_fence_if(eid, fence=0, park_seq=1)
        assert result.acquired
        token = result.fence
    await ev.append(eid, [NewEvent("EXECUTION_RESUMED", {"value": 4})],
                    expected_sequence=2, fence=token)
    await ev.append(eid, [NewEvent("EXECUTION_COMPLETED", {"output": 3})],
                    expected_sequence=3, fence=token)


# -- the raw client: the same statement, one transaction per write ------------------------


def raw_params(op: str, eid: str, seq: int, fence: int | None, kind: str, payload: object,
               metadata: dict[str, object], *, lock: bool = False, park: bool = False,
               channel: str | None = None) -> tuple[object, ...]:
    if op in ("f", "c"):
        return ([op], [eid], [seq], [fence], [False], [False], [0], [], [], [], [None], 0,
                ANSWERING_LITERAL, KERNEL_LITERAL, 0.5)
    return ([op], [eid], [seq], [fence], [lock], [park], [1], [kind],
            [json.dumps(payload, separators=(",", ":"), sort_keys=True)],
            [json.dumps(metadata, separators=(",", ":"), sort_keys=True)], [channel],
            int.from_bytes(os.urandom(7), "big"), ANSWERING_LITERAL, KERNEL_LITERAL, 0.5)


async def raw_execution(
    pool: RawPool, workload: str, eid: str, channel: Callable[[str], str | None]
) -> None:
    ch = channel(eid)
    async with pool.connection() as conn:
        async def run(params: tuple[object, ...]) -> tuple[object, ...]:
            cur = await conn.execute(BATCH, params, prepare=True)
            row = await cur.fetchone()
            assert row is not None, params
            assert row[0] == 0, row
            return row

        if workload in ("unfenced", "fenced"):
            fence = 1 if workload == "fenced" else None
            md: dict[str, object] = {} if fence is None else {"fence": fence}
            await run(raw_params("a", eid, 0, fence, "EXECUTION_STARTED", {"input": 1}, md,
                                 channel=ch))
            await run(raw_params("a", eid, 1, fence, "STEP_COMPLETED",
                                 {"step": "a", "result": 2}, md, channel=ch))
            await run(raw_params("a", eid, 2, fence, "EXECUTION_COMPLETED", {"output": 3}, md,
                                 lock=True, channel=ch))
            return
        await run(raw_params("a", eid, 0, None, "EXECUTION_STARTED", {"input": 1}, {},
                             channel=ch))
        await run(raw_params("a", eid, 1, None, "EXECUTION_SUSPENDED", {"wait": "timer"}, {},
                             lock=True, park=True, channel=ch))
        if workload == "park/acquire_fence":
            token = int(str((await run(raw_params("f", eid, 0, None, "", None, {})))[2]))
        else:
            token = int(str((await run(raw_params("c", eid, 1, 0, "", None, {})))[2]))
        md = {"fence": token}
        await run(raw_params("a", eid, 2, token, "EXECUTION_RESUMED", {"value": 4}, md,
                             lock=True, channel=ch))
        await run(raw_params("a", eid, 3, token, "EXECUTION_COMPLETED", {"output": 3}, md,
                             lock=True, channel=ch))


async def drive(concurrency: int, seconds: float,
                one: Callable[[str], Awaitable[None]], ids: Iterator[str]) -> tuple[int, float]:
    done = 0
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await one(next(ids))
            done += 1

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.monotonic() - start


# -- pgbench ------------------------------------------------------------------------------


def pgbench_script(buckets: int, namespace: str) -> str:
    """The three transactions of a short execution, as the store sends them (with the
    execution's NOTIFY channel computed in SQL the way the store computes it)."""
    answering = "ARRAY[" + ",".join(f"'{k}'" for k in ANSWERING) + "]"
    kernel = "ARRAY[" + ",".join(f"'{k}'" for k in KERNEL) + "]"
    # pgbench cannot compute crc32; the channel is bucket 0..buckets-1 chosen at random,
    # which costs the server the same.
    lines = [
        "\\set r random(1, 9000000000000000000)",
        f"\\set b random(0, {max(buckets, 1) - 1})",
    ]
    steps = [
        (0, "EXECUTION_STARTED", '{"input":1}', "false"),
        (1, "STEP_COMPLETED", '{"result":2,"step":"a"}', "false"),
        (2, "EXECUTION_COMPLETED", '{"output":3}', "true"),
    ]
    channel = f"concat('loom.{namespace}.', :b::integer)" if buckets else "NULL"
    for seq, kind, payload, lock in steps:
        lines.append(
            "SELECT o_status FROM loom_batch(ARRAY['a']::\"char\"[], "
            "ARRAY[concat('pgb-', :r::bigint)], "
            f"ARRAY[{seq}]::bigint[], ARRAY[NULL]::bigint[], ARRAY[{lock}], ARRAY[false], "
            f"ARRAY[1], ARRAY['{kind}'], ARRAY['{payload}'], ARRAY['{{}}'], "
            f"ARRAY[{channel}]::text[], :r::bigint, {answering}, {kernel}, 0.5);"
        )
    return "\n".join(lines) + "\n"


def run_pgbench(bindir: Path, url: str, schema: str, concurrency: int, seconds: float,
                buckets: int) -> tuple[int, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(pgbench_script(buckets, schema))
        script = handle.name
    os.chmod(script, 0o644)
    parts = psycopg.conninfo.conninfo_to_dict(url)
    env = dict(os.environ, PGOPTIONS=f"-c search_path={schema}")
    cmd = [
        str(bindir / "pgbench"), "-n", "-M", "prepared", "-f", script,
        "-c", str(concurrency), "-j", str(min(concurrency, 2)), "-T", str(max(1, round(seconds))),
        "-h", str(parts.get("host", "127.0.0.1")), "-p", str(parts.get("port", 5432)),
        "-U", str(parts.get("user", "postgres")), str(parts.get("dbname", "postgres")),
    ]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    elapsed = time.monotonic() - start
    os.unlink(script)
    processed = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return processed, processed / tps if tps else elapsed


# -- main ---------------------------------------------------------------------------------


def ids_of(prefix: str) -> Iterator[str]:
    return (f"{prefix}{n}" for n in itertools.count(1))


async def main(args: argparse.Namespace, url: str, bindir: Path | None) -> list[Result]:
    schema = "bench"
    results: list[Result] = []
    storage = await open_storage(url, options={"schema": schema, "pool_max_size": 12})
    events = storage.events
    channel = events._listener.channel  # type: ignore[attr-defined]
    # Token 1 for every execution the fenced workload will use.
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        await conn.execute(
            "INSERT INTO loom_fences SELECT concat(c, '-fenced-', n), 1 "
            "FROM unnest(ARRAY['loom', 'raw']) c, generate_series(1, %s) n "
            "ON CONFLICT DO NOTHING", (FENCED_ROWS,)
        )
        # Set hint bits and the visibility map now, not during the timed phase.
        await conn.execute("VACUUM (ANALYZE) loom_fences")
        await conn.execute("CHECKPOINT")
    run_id = os.urandom(3).hex()
    fenced_ids = {c: ids_of(f"{c}-fenced-") for c in ("loom", "raw")}
    other_ids = {c: ids_of(f"{c}-{run_id}-") for c in ("loom", "raw")}

    async def configure(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        await conn.execute("SELECT set_config('search_path', %s, false)", (schema,))

    # Level-major, so the workloads compared with each other run back to back.
    for repeat in range(args.repeat):
        for level in args.levels:
            for workload in args.workloads:
                ids = fenced_ids if workload == "fenced" else other_ids

                async def loom_one(eid: str, workload: str = workload) -> None:
                    await loom_execution(storage, workload, eid)

                pool: RawPool = AsyncConnectionPool(
                    url, min_size=level, max_size=level, open=False,
                    kwargs={"autocommit": True}, configure=configure,
                )
                await pool.open(wait=True)

                async def raw_one(eid: str, workload: str = workload, pool: RawPool = pool) -> None:
                    await raw_execution(pool, workload, eid, channel)

                # Alternate who goes first, so neither always meets the warmer server.
                order = ["loom", "raw"] if repeat % 2 == 0 else ["raw", "loom"]
                for client in order:
                    one = loom_one if client == "loom" else raw_one
                    n, secs = await drive(level, args.seconds, one, ids[client])
                    results.append(Result(workload, client, level, n, secs, repeat))
                await pool.close()
                if workload == "unfenced" and bindir is not None and not args.no_pgbench:
                    n, secs = await asyncio.to_thread(
                        run_pgbench, bindir, url, schema, level, args.seconds,
                        events._db.options.notify_buckets,  # type: ignore[attr-defined]
                    )
                    results.append(Result(workload, "pgbench", level, n, secs, repeat))
                print(f"[{repeat + 1}/{args.repeat}] ", end="", file=sys.stderr)
                print_row(results, workload, level, file=sys.stderr)
    await storage.close()
    return results


def rates_of(results: list[Result], workload: str, client: str, level: int) -> list[float]:
    key = (workload, client, level)
    return sorted(r.rate for r in results if (r.workload, r.client, r.concurrency) == key)


def rate_of(results: list[Result], workload: str, client: str, level: int) -> float | None:
    """The median over the repeats."""
    rates = rates_of(results, workload, client, level)
    return statistics.median(rates) if rates else None


def paired(results: list[Result], base: tuple[str, str], other: tuple[str, str], level: int,
           repeats: int) -> float | None:
    """Median over repeats of rate(base) / rate(other), each from the same repeat."""
    ratios = []
    for repeat in range(repeats):
        rates = {}
        for key in (base, other):
            found = [r.rate for r in results
                     if (r.workload, r.client, r.concurrency, r.repeat) == (*key, level, repeat)]
            if found and found[0] > 0:
                rates[key] = found[0]
        if len(rates) == 2:
            ratios.append(rates[base] / rates[other])
    return statistics.median(ratios) if ratios else None


def print_row(results: list[Result], workload: str, level: int, file: object = None) -> None:
    loom = rate_of(results, workload, "loom", level) or 0.0
    raw = rate_of(results, workload, "raw", level)
    pgb = rate_of(results, workload, "pgbench", level)
    parts = [f"{workload:<22} c={level:<3} loom {loom:8.0f}/s"]
    if raw:
        parts.append(f"raw {raw:8.0f}/s  loom/raw {loom / raw:5.2f}x")
    if pgb:
        parts.append(f"pgbench {pgb:8.0f}/s  loom/pgbench {loom / pgb:5.2f}x")
    print("  ".join(parts), file=file)  # type: ignore[call-overload]


def report(results: list[Result], args: argparse.Namespace) -> str:
    lines = [
        f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.machine()} "
        f"{os.cpu_count()} cpus  python {platform.python_version()}  "
        f"psycopg {psycopg.__version__}  {args.seconds}s per cell, median of "
        f"{args.repeat} interleaved runs",
        "",
        "| workload | concurrent | loom exec/s | raw psycopg exec/s | loom/raw | pgbench exec/s "
        "| loom/pgbench |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in args.workloads:
        for level in args.levels:
            loom = rate_of(results, workload, "loom", level) or 0.0
            raw = rate_of(results, workload, "raw", level)
            pgb = rate_of(results, workload, "pgbench", level)
            lines.append(
                f"| {workload} | {level} | {loom:.0f} | "
                f"{'' if raw is None else f'{raw:.0f}'} | "
                f"{'' if not raw else f'{loom / raw:.2f}x'} | "
                f"{'' if pgb is None else f'{pgb:.0f}'} | "
                f"{'' if not pgb else f'{loom / pgb:.2f}x'} |"
            )
    lines.append("")
    lines.append("Spread (min-max over the repeats, exec/s):")
    for workload in args.workloads:
        for level in args.levels:
            for client in ("loom", "raw", "pgbench"):
                rates = rates_of(results, workload, client, level)
                if len(rates) > 1:
                    lines.append(f"- {workload} c={level} {client}: "
                                 f"{rates[0]:.0f}-{rates[-1]:.0f}")
    lines.append("")
    lines.append("Targets, as the median over the repeats of each repeat's own ratio (the two")
    lines.append("sides of a ratio ran back to back, so load from elsewhere mostly cancels):")
    for level in args.levels:
        for base, other, label in (
            ("unfenced", "fenced", "fenced costs {:+.1%} over unfenced (target <= +10%)"),
            ("park/acquire_fence", "park/acquire_fence_if",
             "the acquire_fence_if resume costs {:+.1%} over acquire_fence (target <= +10%)"),
        ):
            ratio = paired(results, (base, "loom"), (other, "loom"), level, args.repeat)
            if ratio is not None:
                lines.append(f"- c={level}: " + label.format(ratio - 1))
        ratio = paired(results, ("unfenced", "pgbench"), ("unfenced", "loom"), level,
                       args.repeat)
        if ratio is not None:
            lines.append(f"- c={level}: short executions reach {1 / ratio:.2f}x of pgbench"
                         + (" (target >= 0.80x)" if level == 64 else ""))
    return "\n".join(lines)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="use this server instead of starting one")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per cell")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--repeat", type=int, default=3,
                        help="run every cell this many times, interleaved; report medians")
    parser.add_argument("--no-pgbench", action="store_true")
    args = parser.parse_args()
    bindir = find_postgres_bindir()
    if bindir is None and shutil.which("pgbench"):
        bindir = Path(shutil.which("pgbench")).parent  # type: ignore[arg-type]
    with contextlib.ExitStack() as stack:
        if args.url:
            url = args.url
        else:
            cluster = stack.enter_context(ThrowawayCluster(settings=dict(DURABLE_SETTINGS)))
            with psycopg.connect(cluster.url, autocommit=True) as conn:
                conn.execute("CREATE DATABASE bench")
            url = cluster.url.rsplit("/", 1)[0] + "/bench"
        results = asyncio.run(main(args, url, bindir))
    print(report(results, args))


if __name__ == "__main__":
    cli()
