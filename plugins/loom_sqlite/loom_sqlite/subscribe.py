"""Live subscriptions: existing events, then new ones, including other processes' appends.

An append made through this storage wakes its execution's subscribers at once. Appends by
another process sharing the file are found by polling: while anyone is subscribed, one
poller per storage reads ``PRAGMA data_version`` (a counter SQLite bumps when *another*
connection commits, one cheap read for all subscriptions) every ``subscribe_poll_ms``
(default 50 ms) on each of the storage's connections and, when a connection outside the
storage committed (both moved), wakes every subscriber to re-read its log. So another
process's event reaches a subscriber within about one poll interval plus one read.

A subscriber registers its wake-up signal *before* it reads, so an append that lands
between its read and its wait still wakes it; the poller wakes everyone on its first
round, so a commit between a read and the poller's first look is not missed either.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, final

from loom_core import Event, StorageError
from loom_sqlite.errors import DatabaseClosedError
from loom_sqlite.transactions import TransactionRunner

__all__ = ["Subscriptions"]

DATA_VERSION: Final = "PRAGMA data_version"
BATCH: Final = 256


def _data_version(raw: sqlite3.Connection) -> int:
    return int(raw.execute(DATA_VERSION).fetchone()[0])


def _another_committed(before: tuple[int, int | None], now: tuple[int, int | None]) -> bool:
    """Whether a connection outside this storage committed since ``before``: then both of
    its connections' versions have moved (with one connection, that one). Compared with
    the last wake, not the last poll: the two are read one after the other, so another
    process's commit between the two reads moves one in this poll and the other in the
    next. The storage's own two connections moving each other wakes everyone too, which
    costs a read per subscriber and misses nothing."""
    thread_moved = before[0] != now[0]
    if now[1] is None:
        return thread_moved
    return thread_moved and (before[1] != now[1] or now[1] == -1)


@final
class Subscriptions:
    """Wake-up signals of the waiting subscribers, and the cross-process poller."""

    __slots__ = ("_closed", "_poll_seconds", "_poller", "_runner", "_waiting")

    def __init__(self, runner: TransactionRunner, poll_ms: int) -> None:
        self._runner = runner
        self._poll_seconds = poll_ms / 1000
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    def wake(self, execution_id: str) -> None:
        """Called after this storage committed events for ``execution_id``."""
        for signal in self._waiting.pop(execution_id, ()):
            signal.set()

    def _wake_all(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for signals in waiting.values():
            for signal in signals:
                signal.set()

    def _register(self, execution_id: str) -> asyncio.Event:
        signal = asyncio.Event()
        self._waiting.setdefault(execution_id, set()).add(signal)
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        return signal

    def _unregister(self, execution_id: str, signal: asyncio.Event) -> None:
        signals = self._waiting.get(execution_id)
        if signals is not None:
            signals.discard(signal)
            if not signals:
                del self._waiting[execution_id]

    async def _poll(self) -> None:
        woken_at: tuple[int, int | None] | None = None  # the versions at the last wake
        try:
            # Only while someone waits: an abandoned subscription stops costing reads.
            while self._waiting and not self._closed:
                versions: tuple[int, int | None] | None
                try:
                    versions = await self._versions()
                except DatabaseClosedError:
                    return
                except StorageError:
                    # Whether anyone committed is unknown: everyone re-reads (a read that
                    # fails too reaches its subscriber), and the poll goes on. A poller
                    # that ended here would leave them waiting for good.
                    versions = None
                if versions is None or woken_at is None or _another_committed(
                    woken_at, versions
                ):
                    self._wake_all()
                    woken_at = versions
                await asyncio.sleep(self._poll_seconds)
        finally:
            self._poller = None

    async def _versions(self) -> tuple[int, int | None]:
        """``data_version`` as the thread's connection and the loop's see it.

        Each one moves when a connection other than itself commits, so the storage's own
        two connections move each other's; a commit by another process moves both.
        """
        connection = self._runner.connection
        on_thread = await connection.call(
            _data_version, doing="polling for other processes' commits", write=False
        )
        loop_raw = connection.loop_raw
        if loop_raw is None:
            return on_thread, None
        try:
            return on_thread, _data_version(loop_raw)  # a read of the shared index
        except sqlite3.Error:
            return on_thread, -1  # unknown: counts as moved, so everyone re-reads
    async def follow(
        self,
        execution_id: str,
        next_sequence: int,
        read: Callable[[str, int, int], Awaitable[tuple[Event, ...]]],
    ) -> AsyncIterator[Event]:
        """Yield events of ``execution_id`` from ``next_sequence`` on, until closed;
        ``read(execution_id, from_sequence, limit)`` reads one batch."""
        while not self._closed:
            signal = self._register(execution_id)
            try:
                batch = await read(execution_id, next_sequence, BATCH)
                if not batch:
                    await signal.wait()
                    continue
            except DatabaseClosedError:
                return
            finally:
                self._unregister(execution_id, signal)
            for event in batch:
                next_sequence = event.sequence + 1
                yield event

    async def close(self) -> None:
        self._closed = True
        self._wake_all()
        poller = self._poller
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
