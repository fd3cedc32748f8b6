"""Live ``subscribe`` across nodes: LISTEN/NOTIFY over hashed buckets.

An append that lands notifies the channel of its execution's bucket (``zlib.crc32`` of
the id modulo ``notify_buckets``, so every node must use the same number) with the
execution id as payload, in the append's own transaction. Each storage keeps ONE
dedicated listening connection, outside the pool, opened on the first ``subscribe``,
and LISTENs only to the buckets its subscribers need.

A listener that stops reading must not block commits. PostgreSQL keeps notifications in
one queue per cluster until every listening session has read them; a session that never
reads fills it, and once it is full every commit that notifies FAILS. So:

* our own listener never stops reading: a task drains the connection whatever the
  subscribers do, and a notification only sets a coalescing per-execution flag (no
  queue, no payload kept), so a subscriber that stops iterating holds nothing back; it
  re-reads the log from its own position when it resumes;
* a foreign session (or a frozen process) can still stall the queue, so an append checks
  ``pg_notification_queue_usage()`` first and above ``notify_queue_limit`` (default half
  the queue) skips its wake-up instead of failing, and the store warns at most once a
  minute. A skipped wake-up is not resent; a live subscriber re-reads every
  ``subscribe_poll_interval`` anyway, so it is late, never wrong.

Wake-ups of appends made by this same storage are delivered in-process at once, without
waiting for the NOTIFY round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Awaitable, Callable
from typing import Final, final

import psycopg
from psycopg import sql

from loom_postgres.database import Connection
from loom_postgres.failures import describe

__all__ = ["Listener", "Watch", "channel_of"]

_TICK: Final = 0.1


def channel_of(execution_id: str, buckets: int, namespace: str) -> str | None:
    """The NOTIFY channel of ``execution_id``, or None when wake-ups are off."""
    if buckets <= 0:
        return None
    return f"loom.{namespace}.{zlib.crc32(execution_id.encode('utf-8')) % buckets}"


@final
class Watch:
    """A subscriber's interest in one execution: ``signal`` is set when it may have new
    events. Call :meth:`release` when done."""

    __slots__ = ("_listener", "execution_id", "signal")

    def __init__(self, listener: Listener, execution_id: str) -> None:
        self._listener = listener
        self.execution_id = execution_id
        self.signal = asyncio.Event()

    def release(self) -> None:
        self._listener._release(self)


@final
class Listener:
    """The storage's LISTEN connection and the in-process fan-out of wake-ups."""

    __slots__ = ("_buckets", "_closed", "_connect", "_listened", "_namespace", "_ready",
                 "_task", "_warn", "_watches", "connected")

    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection]],
        *,
        buckets: int,
        namespace: str,
        warn: Callable[[str, str], None],
    ) -> None:
        self._connect = connect
        self._buckets = buckets
        self._namespace = namespace
        self._warn = warn
        self._watches: dict[str, set[Watch]] = {}
        self._listened: set[str] = set()
        self._ready: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.connected = asyncio.Event()

    def channel(self, execution_id: str) -> str | None:
        return channel_of(execution_id, self._buckets, self._namespace)

    async def watch(self, execution_id: str, *, ready_timeout: float) -> Watch:
        """Register interest in ``execution_id``. Returns once its channel is LISTENed
        (or after ``ready_timeout`` if the server cannot be reached: polling covers it),
        so a subscriber that reads the log after this cannot miss a later append."""
        watch = Watch(self, execution_id)
        self._watches.setdefault(execution_id, set()).add(watch)
        channel = self.channel(execution_id)
        if channel is None or self._closed:
            return watch
        ready = self._ready.get(channel)
        if ready is None:
            ready = self._ready[channel] = asyncio.Event()
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        if not ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), ready_timeout)
        return watch

    def _release(self, watch: Watch) -> None:
        watches = self._watches.get(watch.execution_id)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.execution_id]

    def wake(self, execution_id: str) -> None:
        """Wake this process's subscribers of ``execution_id`` (after our own append, or
        on a notification)."""
        for watch in self._watches.get(execution_id, ()):
            watch.signal.set()

    def wake_all(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.signal.set()

    async def _run(self) -> None:
        attempt = 0
        while not self._closed:
            conn: Connection | None = None
            try:
                conn = await self._connect()
                self._listened.clear()
                await self._sync_channels(conn)
                self.connected.set()
                # Anything sent while we were not listening is lost: everyone re-reads,
                # now that the channels are listened again.
                self.wake_all()
                attempt = 0
                while not self._closed:
                    await self._sync_channels(conn)
                    async for note in conn.notifies(timeout=_TICK):
                        self.wake(note.payload)
            except (psycopg.Error, OSError) as exc:
                self.connected.clear()
                if self._closed:
                    break
                self._warn(
                    "listener",
                    f"loom-postgres: the LISTEN connection failed ({describe(exc)}); "
                    "reconnecting, subscribers poll meanwhile",
                )
                attempt += 1
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()

    async def _sync_channels(self, conn: Connection) -> None:
        wanted = set(self._ready)
        for channel in sorted(wanted - self._listened):
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self._listened.add(channel)
        for channel in wanted:
            event = self._ready[channel]
            if not event.is_set():
                event.set()

    async def close(self) -> None:
        self._closed = True
        self.wake_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
