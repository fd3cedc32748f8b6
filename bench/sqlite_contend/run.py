"""Several real processes on one SQLite file: workers, starters, a long reader, SIGKILLs.

    python bench/sqlite_contend/run.py --executions 300 --kills 20 --seed 1

Starts 4 ``loom worker`` processes (nodes ``w-0`` … ``w-3``) and 2 starter processes on
one file; meanwhile SIGKILLs a random one of them every so often (and starts it again
under the same node), and has the ``sqlite3`` CLI hold a read transaction open for a few
seconds at a time. Then checks, from the file and from the effects the steps wrote
outside Loom: every execution completed exactly once, each step is recorded once, every
report to ``on_error``/``on_storage_error`` is a ``LoomError``, no process printed an
untyped ``database is locked``. Prints the figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKERS = 4
STARTERS = 2
READ = b"BEGIN;\nSELECT count(*) FROM loom_events;\n"


def env_for(url: str, directory: Path, busy_ms: int) -> dict[str, str]:
    env = dict(os.environ)
    env["LOOM_CONTEND_URL"] = url
    env["LOOM_CONTEND_DIR"] = str(directory)
    env["LOOM_CONTEND_BUSY_MS"] = str(busy_ms)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executions", type=int, default=300)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--busy-ms", type=int, default=5000)
    parser.add_argument("--reader-seconds", type=float, default=3.0)
    parser.add_argument("--no-reader", action="store_true")
    parser.add_argument(
        "--lock", action="store_true",
        help="the CLI holds the write lock (BEGIN IMMEDIATE) instead of a read transaction")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    directory = Path(tempfile.mkdtemp(prefix="loom-contend-"))
    db = directory / "loom.db"
    url = f"sqlite:///{db}"
    env = env_for(url, directory, args.busy_ms)
    logs = directory / "logs"
    logs.mkdir()
    per = args.executions // STARTERS

    def spawn(name: str) -> subprocess.Popen[bytes]:
        out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        if name.startswith("w-"):
            cmd = [sys.executable, "-m", "loom_runtime", "worker", "--app", "contend_app:app",
                   "--node", name]
        else:
            index = int(name.split("-")[1])
            cmd = [sys.executable, str(HERE / "starter.py"), url, str(directory), name,
                   f"x{index}", str(index * per), str(per)]
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=HERE)

    started = time.monotonic()
    procs = {f"w-{i}": spawn(f"w-{i}") for i in range(WORKERS)}
    procs.update({f"s-{i}": spawn(f"s-{i}") for i in range(STARTERS)})
    kills: Counter[str] = Counter()
    wal_max = 0
    salts: set[bytes] = set()
    wal_curve: list[tuple[int, int]] = []
    reader: subprocess.Popen[bytes] | None = None
    reader_until = 0.0
    readers = 0
    next_kill = time.monotonic() + rng.uniform(0.2, 1.5)
    next_reader = time.monotonic() + rng.uniform(0.5, 2.0)

    def completed() -> int:
        with contextlib.closing(
            sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        ) as ro:
            count: int = ro.execute(
                "SELECT count(*) FROM loom_events WHERE kind = 'EXECUTION_COMPLETED' "
                "AND execution_id NOT LIKE '$%'").fetchone()[0]
            return count

    done = 0
    while True:
        now = time.monotonic()
        if now - started > args.timeout:
            print(f"TIMEOUT: {done} of {args.executions} completed")
            break
        wal = db.with_name("loom.db-wal")
        if wal.exists():
            wal_size = wal.stat().st_size
            with open(wal, "rb") as header:
                salts.add(header.read(24)[16:24])
            wal_max = max(wal_max, wal_size)
            if done * 10 // args.executions > len(wal_curve):
                wal_curve.append((done, wal_size))
        if sum(kills.values()) < args.kills and now >= next_kill:
            victim = rng.choice(sorted(procs))
            proc = procs[victim]
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills[victim] += 1
                procs[victim] = spawn(victim)
            next_kill = now + rng.uniform(0.2, 1.5)
        if reader is None and not args.no_reader and now >= next_reader:
            reader = subprocess.Popen(["sqlite3", str(db)], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert reader.stdin is not None
            hold = b"BEGIN IMMEDIATE;\n" if args.lock else READ

            reader.stdin.write(hold)
            reader.stdin.flush()
            reader_until = now + args.reader_seconds
            readers += 1
        if reader is not None and now >= reader_until:
            assert reader.stdin is not None
            reader.stdin.write(b"COMMIT;\n.quit\n")
            reader.stdin.close()
            reader.wait()
            reader = None
            next_reader = now + rng.uniform(0.5, 3.0)
        for name, proc in procs.items():
            if name.startswith("s-") and proc.poll() not in (None, 0):
                procs[name] = spawn(name)  # a starter that failed on its own: run it again
        with contextlib.suppress(sqlite3.Error):  # a reader SIGKILLed mid-open, say
            done = completed()
        if done >= args.executions and all(
            procs[f"s-{i}"].poll() == 0 for i in range(STARTERS)):
            break
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    if reader is not None:
        reader.kill()
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    exits: dict[str, int | str] = {}
    for name, proc in procs.items():
        try:
            exits[name] = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            exits[name] = "still running 30 s after SIGTERM"
    stop_seconds = time.monotonic() - stopped_at
    check(directory, db, args.executions, per)
    print(json.dumps({
        "seed": seed, "executions": args.executions, "elapsed_s": round(elapsed, 1),
        "kills": dict(kills), "readers": readers, "exits": exits,
        "stop_s": round(stop_seconds, 1), "wal_resets_seen": len(salts) - 1,
        "wal_max_bytes": wal_max, "wal_by_completed": wal_curve,
        "directory": str(directory)}))


def check(directory: Path, db: Path, executions: int, per: int) -> None:
    ids = [f"x{s}-{i}" for s in range(STARTERS) for i in range(s * per, s * per + per)]
    problems: list[str] = []
    with sqlite3.connect(db) as conn:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            problems.append(f"integrity_check: {integrity}")
        rows = conn.execute(
            "SELECT execution_id, sequence, kind, payload FROM loom_events "
            "WHERE execution_id NOT LIKE '$%' ORDER BY execution_id, sequence").fetchall()
    by_id: dict[str, list[tuple[int, str, str]]] = {}
    for eid, seq, kind, payload in rows:
        by_id.setdefault(eid, []).append((seq, kind, payload))
    effects: Counter[tuple[str, str]] = Counter()
    tokens: dict[tuple[str, str], set[str]] = {}
    for line in (directory / "effects.log").read_text().splitlines():
        eid, step, _pid, token = line.split()
        effects[(eid, step)] += 1
        tokens.setdefault((eid, step), set()).add(token)
    reruns = 0
    for eid in ids:
        log = by_id.get(eid, [])
        kinds = [k for _, k, _ in log]
        if [s for s, _, _ in log] != list(range(len(log))):
            problems.append(f"{eid}: gap or duplicate sequence")
        if kinds.count("EXECUTION_COMPLETED") != 1:
            problems.append(f"{eid}: {kinds.count('EXECUTION_COMPLETED')} completions: {kinds}")
        steps = [json.loads(p) for _, k, p in log if k == "STEP_COMPLETED"]
        if len(steps) != 2:
            problems.append(f"{eid}: {len(steps)} steps recorded")
        for step in ("a", "b"):
            if effects[(eid, step)] < 1:
                problems.append(f"{eid} {step}: effect never ran")
            reruns += max(0, effects[(eid, step)] - 1)
        for step_payload in steps:
            result = step_payload.get("result")
            found = any(result in tokens.get((eid, s), set()) for s in ("a", "b"))
            if not found:
                problems.append(f"{eid}: recorded result {result!r} no effect wrote")
    reports = (directory / "reports.log")
    report_lines = reports.read_text().splitlines() if reports.exists() else []
    report_kinds = Counter(" ".join(line.split()[2:4]) for line in report_lines)
    untyped = [line for line in report_lines if line.split()[3] != "True"]
    problems.extend(f"untyped report: {line}" for line in untyped[:10])
    for log_file in (directory / "logs").iterdir():
        text = log_file.read_text(errors="replace")
        if "database is locked" in text or "Traceback" in text:
            problems.append(f"{log_file.name}: {text[-2000:]}")
    print(f"effects re-run after kills: {reruns}; reports: {dict(report_kinds)}")
    for p in problems[:30]:
        print("PROBLEM:", p)
    print(f"{len(problems)} problems")


if __name__ == "__main__":
    main()
