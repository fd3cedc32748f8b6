"""pgbench running the same transactions as a scenario against the same server.

The script is generated from the scenario's steps and writes the raw floor's tables with
the raw floor's statements (:mod:`loom_bench.raw_postgres`): one pgbench "transaction" is
one whole execution (three autocommit inserts for a short one), so pgbench's tps is
executions per second. Clients equal the concurrency, threads are ``min(clients, CPUs)``,
each client runs ``ceil(executions / clients)`` executions, in prepared mode. Every value
(kinds, payloads, the id prefix) reaches the server as a bind parameter through ``-D``;
the script holds no data. Latencies come from pgbench's per-transaction log.
"""

from __future__ import annotations

import asyncio
import glob
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loom_bench.drive import RunPlan, Tick
from loom_bench.scenarios import PARK, AcquireFence, Append, Scenario
from loom_bench.statistics import Sample, percentile
from loom_core.spi import ANSWERING_KINDS, KERNEL_KINDS

__all__ = [
    "PgbenchError",
    "PgbenchRun",
    "find_pgbench",
    "measure_pgbench",
    "parse_latencies",
    "parse_summary",
    "script_for",
]

_ID: Final = "(:prefix::text || '-' || :eid::text)"
_COLUMNS: Final = "bench_raw_events (execution_id, sequence, kind, payload, metadata)"
_TPS: Final = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.M)
_PROCESSED: Final = re.compile(r"^number of transactions actually processed: (\d+)", re.M)
_FAILED: Final = re.compile(r"^number of failed transactions: (\d+)", re.M)
_PROGRESS: Final = re.compile(r"^progress: ([0-9.]+) s, ([0-9.]+) tps")


class PgbenchError(RuntimeError):
    """pgbench could not be run, failed, or printed no figure."""


@dataclass(frozen=True, slots=True)
class PgbenchRun:
    """What a pgbench invocation needs besides the plan."""

    executable: str
    url: str
    threads: int


def find_pgbench(explicit: str | None = None) -> str | None:
    """``explicit``, else ``pgbench`` on PATH, else the newest Debian-layout install."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pgbench"),
        key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0,
    )
    return candidates[-1] if candidates else None


def _pg_json(template_index: int) -> str:
    return f":p{template_index}::jsonb"


def script_for(scenario: Scenario) -> tuple[str, dict[str, str]]:
    """The pgbench script for one execution of ``scenario`` and the ``-D`` variables it
    reads (every value it writes)."""
    lines = ["\\set eid random(1, 9223372036854775806)"]
    variables: dict[str, str] = {
        "answering": "{" + ",".join(sorted(ANSWERING_KINDS)) + "}",
        "kernel": "{" + ",".join(sorted(KERNEL_KINDS)) + "}",
    }
    sequence = 0
    # pgbench draws its ids at random, so a setup cannot run on them before the clock:
    # the script presents the token the setup would leave, and its fence lookups find no
    # row (the same index probe as finding one).
    fenced_yet = scenario.held_token is not None
    if scenario.held_token is not None:
        variables["token"] = str(scenario.held_token)
    park_sequence = -1
    park_token = "0"
    for index, step in enumerate(scenario.steps):
        if isinstance(step, Append):
            variables[f"k{index}"] = step.event.kind
            variables[f"p{index}"] = json.dumps(step.event.payload, separators=(",", ":"))
            variables[f"s{index}"] = str(sequence)
            values = f"{_ID}, :s{index}::integer, :k{index}, {_pg_json(index)}"
            if step.fenced and fenced_yet:
                lock = " FOR SHARE" if step.event.kind in ANSWERING_KINDS else ""
                if step.event.kind == PARK.kind:
                    park_sequence, park_token = sequence, ":token::bigint"
                    variables["park_seq"] = str(sequence)
                lines.append(
                    f"INSERT INTO {_COLUMNS} SELECT {values}, "
                    "jsonb_build_object('fence', :token::bigint) WHERE COALESCE((SELECT "
                    f"token FROM bench_raw_fences WHERE execution_id = {_ID}{lock}), 0) "
                    "<= :token::bigint;"
                )
            elif step.event.kind == PARK.kind:
                lines.append(
                    "WITH fence AS (INSERT INTO bench_raw_fences (execution_id, token) "
                    f"VALUES ({_ID}, 0) ON CONFLICT (execution_id) DO NOTHING) "
                    f"INSERT INTO {_COLUMNS} VALUES ({values}, '{{}}'::jsonb);"
                )
                park_sequence = sequence
                variables["park_seq"] = str(sequence)
            else:
                lines.append(f"INSERT INTO {_COLUMNS} VALUES ({values}, '{{}}'::jsonb);")
            sequence += 1
        elif isinstance(step, AcquireFence):
            lines.append(
                f"INSERT INTO bench_raw_fences (execution_id, token) VALUES ({_ID}, 1) "
                "ON CONFLICT (execution_id) DO UPDATE SET token = bench_raw_fences.token + 1 "
                "RETURNING token \\gset"
            )
            fenced_yet = True
        else:
            if park_sequence < 0:
                raise ValueError(f"scenario {scenario.key!r} acquires on a park it never wrote")
            lines += [
                "BEGIN;",
                f"SELECT token AS locked FROM bench_raw_fences WHERE execution_id = {_ID} "
                "FOR UPDATE \\gset",
                f"UPDATE bench_raw_fences SET token = token + 1 WHERE execution_id = {_ID} "
                f"AND token = {park_token} AND NOT EXISTS (SELECT 1 FROM bench_raw_events "
                f"WHERE execution_id = {_ID} AND sequence > :park_seq::integer AND ("
                "kind = ANY(:answering::text[]) OR (kind <> ALL(:kernel::text[]) "
                "AND metadata -> 'kernel' = 'true'::jsonb))) RETURNING token \\gset",
                "END;",
            ]
            fenced_yet = True
    return "\n".join(lines) + "\n", variables


def parse_summary(output: str) -> tuple[float, int]:
    """(tps without connection time, transactions processed) from pgbench's report;
    refuses a report with failed transactions or without the figures."""
    tps = _TPS.search(output)
    processed = _PROCESSED.search(output)
    if tps is None or processed is None:
        raise PgbenchError(f"pgbench printed no tps figure:\n{output[-2000:]}")
    failed = _FAILED.search(output)
    if failed is not None and int(failed.group(1)) > 0:
        raise PgbenchError(f"pgbench reported {failed.group(1)} failed transactions")
    return float(tps.group(1)), int(processed.group(1))


def parse_latencies(lines: Sequence[str]) -> list[float]:
    """Per-transaction latencies in seconds from pgbench ``-l`` log lines
    (``client transaction_no latency_us script_no epoch epoch_us``)."""
    latencies = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2].isdigit():
            latencies.append(int(fields[2]) / 1_000_000)
    return latencies


def _read_logs(directory: Path) -> list[str]:
    lines: list[str] = []
    for log in directory.glob("pgbench_log.*"):
        lines += log.read_text().splitlines()
    return lines


async def measure_pgbench(
    run: PgbenchRun, scenario: Scenario, plan: RunPlan, tick: Tick
) -> Sample:
    """One timed pgbench run of ``scenario`` (no warm-up: pgbench connects afresh)."""
    script, variables = script_for(scenario)
    clients = plan.concurrency
    per_client = math.ceil(plan.executions / clients)
    threads = max(1, min(clients, run.threads))
    with tempfile.TemporaryDirectory(prefix="loom-pgbench-") as tmp:
        script_path = Path(tmp) / f"{scenario.key}.sql"
        script_path.write_text(script)
        argv = [
            run.executable, "--no-vacuum", "--protocol=prepared", "--progress=1",
            f"--client={clients}", f"--jobs={threads}", f"--transactions={per_client}",
            f"--file={script_path}", "--log", f"--log-prefix={Path(tmp) / 'pgbench_log'}",
            f"--define=prefix={plan.prefix}",
            *(f"--define={name}={value}" for name, value in variables.items()),
            run.url,
        ]
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=tmp
        )
        assert process.stdout is not None
        stderr_lines: list[str] = []

        async def follow_progress() -> None:
            assert process.stderr is not None
            seen = 0.0
            last_at = 0.0
            async for raw in process.stderr:
                line = raw.decode(errors="replace").rstrip()
                stderr_lines.append(line)
                match = _PROGRESS.match(line)
                if match:
                    at, tps = float(match.group(1)), float(match.group(2))
                    target = min(seen + tps * (at - last_at), clients * per_client)
                    for _ in range(int(target) - int(seen)):
                        tick()
                    seen, last_at = target, at

        follower = asyncio.create_task(follow_progress())
        stdout = (await process.stdout.read()).decode(errors="replace")
        await process.wait()
        await follower
        if process.returncode != 0:
            raise PgbenchError(
                f"pgbench exited with {process.returncode}: "
                + "\n".join(stderr_lines[-20:] or [stdout[-2000:]])
            )
        tps, processed = parse_summary(stdout)
        log_lines = await asyncio.to_thread(_read_logs, Path(tmp))
    latencies = parse_latencies(log_lines)
    if not latencies:
        raise PgbenchError("pgbench wrote no per-transaction log")
    return Sample(
        executions=processed,
        seconds=processed / tps,
        p50_ms=percentile(latencies, 0.5) * 1000.0,
        p99_ms=percentile(latencies, 0.99) * 1000.0,
    )
