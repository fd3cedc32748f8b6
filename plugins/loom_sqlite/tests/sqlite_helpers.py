"""Helpers shared by the loom-sqlite tests: URLs, subprocess plumbing and a parked log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loom_core import NewEvent, Storage

WORKER = Path(__file__).with_name("sqlite_worker.py")


def url_for(path: Path) -> str:
    """``sqlite:///`` then the path: an absolute path gives four slashes."""
    return "sqlite:///" + str(path)


def spawn(*args: str) -> subprocess.Popen[str]:
    """Start ``sqlite_worker.py`` with ``args`` in its own process, line-buffered text pipes."""
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


def file_bytes(path: Path) -> bytes:
    """The file's content (a plain function: tests check files from async code too)."""
    return path.read_bytes()


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def smash_pages(path: Path, keep_pages: int, page_size: int = 4096) -> None:
    """Overwrite every page after the first ``keep_pages`` with 0xFF bytes."""
    size = path.stat().st_size
    with path.open("r+b") as damaged:
        damaged.seek(page_size * keep_pages)
        damaged.write(b"\xff" * (size - page_size * keep_pages))


def finish(process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Wait for ``process`` to exit; fail with its stderr unless it exited 0."""
    process.wait(timeout=timeout)
    if process.returncode != 0:
        assert process.stderr is not None
        raise AssertionError(f"worker exited {process.returncode}: {process.stderr.read()}")


async def parked(storage: Storage, execution_id: str = "p") -> int:
    """``execution_id`` started under a fence and parked at sequence 1; the park's token."""
    token = await storage.events.acquire_fence(execution_id)
    await storage.events.append(
        execution_id,
        [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED")],
        expected_sequence=0,
        fence=token,
    )
    return token
