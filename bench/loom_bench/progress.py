"""The progress display: one line on stderr, redrawn in place while a run goes.

On a terminal the line is redrawn five times a second (which run of how many, the row,
the side, executions done and the current rate); elsewhere (a CI log, a pipe) one plain
line is printed per finished run instead, so a log stays readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from time import perf_counter
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]

_REDRAW_SECONDS = 0.2


class Progress:
    """Counts runs and executions; safe to tick from a worker thread (an int increment)."""

    __slots__ = (
        "_began",
        "_done",
        "_enabled",
        "_label",
        "_painter",
        "_run",
        "_started",
        "_stream",
        "_target",
        "_total_runs",
        "_tty",
    )

    def __init__(
        self, total_runs: int, *, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled
        self._tty = enabled and self._stream.isatty()
        self._total_runs = total_runs
        self._run = 0
        self._label = ""
        self._done = 0
        self._target = 0
        self._began = perf_counter()
        self._started = perf_counter()
        self._painter: asyncio.Task[None] | None = None

    def start_run(self, label: str, executions: int) -> None:
        self._run += 1
        self._label = label
        self._done = 0
        self._target = executions
        self._began = perf_counter()

    def tick(self) -> None:
        self._done += 1

    def finish_run(self, outcome: str) -> None:
        if self._enabled and not self._tty:
            self._stream.write(f"[{self._run}/{self._total_runs}] {self._label}: {outcome}\n")
            self._stream.flush()

    def line(self) -> str:
        """The current progress line (without terminal control characters)."""
        elapsed = perf_counter() - self._began
        rate = self._done / elapsed if elapsed > 0 else 0.0
        total = int(perf_counter() - self._started)
        return (
            f"[run {self._run}/{self._total_runs}] {self._label} "
            f"{self._done}/{self._target} · {rate:,.0f}/s · {total // 60}:{total % 60:02d} elapsed"
        )

    def _paint(self) -> None:
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self._stream.write("\r\x1b[2K" + self.line()[:width])
        self._stream.flush()

    async def _keep_painting(self) -> None:
        while True:
            self._paint()
            await asyncio.sleep(_REDRAW_SECONDS)

    async def __aenter__(self) -> Progress:
        if self._tty:
            self._painter = asyncio.create_task(self._keep_painting())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._painter is not None:
            self._painter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._painter
            self._stream.write("\r\x1b[2K")
            self._stream.flush()
