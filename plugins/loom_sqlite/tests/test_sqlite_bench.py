"""The benchmark script runs and prints, per workload, the ratio to raw sqlite3 (a smoke
run: tiny, so its figures mean nothing; docs/benchmarks.md has the real ones)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[3] / "bench" / "sqlite_bench.py"
WORKLOADS = ("short", "short-fenced", "park", "park-fenced", "park-fence-if")


def test_the_benchmark_prints_a_ratio_to_raw_sqlite3_for_every_workload(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--executions", "40", "--concurrency", "8",
         "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    rows = {
        match.group(1): float(match.group(2))
        for match in re.finditer(r"^(\S+)\s+8\s+\d+\s+\d+\s+(\d+\.\d+)x$", run.stdout, re.M)
    }
    assert sorted(rows) == sorted(WORKLOADS), run.stdout
    assert all(ratio > 0 for ratio in rows.values())
