"""``python -m loom_conformance.explorer --url sqlite:///...``: the schedule explorer on a
file, which keeps what each schedule wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def explore(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom_conformance.explorer", "--steps", "6", *arguments],
        capture_output=True, text=True, check=False, timeout=300,
    )


def test_the_explorer_runs_every_schedule_on_one_file_by_default(tmp_path: Path) -> None:
    done = explore("--url", f"sqlite:///{tmp_path / 'explored.db'}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("acquire_fence_if: 127 schedules, 0 violations\n")
    assert "negative control, unconditional acquire_fence: 127 schedules, 6 violations" in (
        done.stdout
    )


def test_the_explorer_says_why_a_file_cannot_be_explored_a_schedule_a_store(
    tmp_path: Path,
) -> None:
    """Each schedule opens the URL again, and finds the execution the schedule before
    started in the file: one line saying so and what to do, not a traceback."""
    done = explore("--url", f"sqlite:///{tmp_path / 'explored.db'}", "--isolation", "store")
    assert done.returncode == 2, done.stderr
    assert "already holds executions ('explored')" in done.stderr
    assert "--isolation execution" in done.stderr
    assert "Traceback" not in done.stderr
