"""Helpers shared by the loom-sqlite tests: URLs and subprocess plumbing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("worker.py")


def url_for(path: Path) -> str:
    """``sqlite:///`` then the path: an absolute path gives four slashes."""
    return "sqlite:///" + str(path)


def spawn(*args: str) -> subprocess.Popen[str]:
    """Start ``worker.py`` with ``args`` in its own process, line-buffered text pipes."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def expect_line(process: subprocess.Popen[str], expected: str | None = None) -> str:
    """The next stdout line of ``process``; fails with its stderr if it ended instead."""
    assert process.stdout is not None
    line = process.stdout.readline().rstrip("\n")
    if not line:
        process.wait(timeout=30)
        assert process.stderr is not None
        raise AssertionError(f"worker ended (rc {process.returncode}): {process.stderr.read()}")
    if expected is not None:
        assert line == expected
    return line


def send(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()
