"""The machine and the code a benchmark ran on, for the report.

Figures from different commits are only comparable on the same machine, and these
machines are shared: the load average before and after a run is recorded beside the
figures so a reader can see when a run was disturbed.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

__all__ = ["collect", "cpu_model", "git_state", "load_average", "loom_distributions"]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def git_state(where: Path | None = None) -> dict[str, object]:
    """The commit of the checkout the harness runs from (its own source tree, else the
    working directory), and whether tracked files differ from it."""
    cwd = where or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


_MEASURED = frozenset(
    {"psycopg", "psycopg-pool", "aiosqlite", "dbos", "eventsourcing", "orjson", "cryptography"}
)
"""Third-party distributions whose version changes the figures: drivers, peers, and the
libraries a store spends its time in (before the in-memory log kept copies of its texts,
orjson 3.13 cost it a third more CPU than 3.11)."""


def loom_distributions() -> dict[str, str]:
    """Installed Loom distributions, drivers, peers and the JSON and crypto libraries, and
    their versions (which backends, which peers and which encoders were measured)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith("loom-") or name.lower() in _MEASURED:
            found.setdefault(name, dist.version)  # the first on sys.path is the one imported
    return dict(sorted(found.items()))


def collect() -> dict[str, object]:
    """Everything above, plus CPU count and Python, as one JSON-ready mapping."""
    return {
        **git_state(),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "distributions": loom_distributions(),
        "load_average_before": load_average(),
    }
