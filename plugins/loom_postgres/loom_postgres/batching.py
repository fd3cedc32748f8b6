"""Group commit: concurrent writes share one round-trip and one commit.

A write is queued with a future. While fewer than ``max_inflight`` batches are running,
the queue is flushed at once, so a lone writer waits for nobody; under load the writes
that arrive while batches are in flight accumulate and leave together in the next one
(up to ``max_batch``). The batch runner settles every future on its own: one write's
conflict or error never becomes another's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, final

from loom_core.errors import StoreClosedError

__all__ = ["GroupCommitter", "Pending"]

T = TypeVar("T")
R = TypeVar("R")


@final
class Pending(Generic[T, R]):
    """One queued write and the future its caller awaits."""

    __slots__ = ("future", "op")

    def __init__(self, op: T, future: asyncio.Future[R]) -> None:
        self.op = op
        self.future = future

    def resolve(self, result: R) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def reject(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@final
class GroupCommitter(Generic[T, R]):
    """Coalesces writes into batches run by ``run`` (which must settle each Pending)."""

    __slots__ = ("_closed", "_idle", "_inflight", "_max_batch", "_max_inflight", "_queue",
                 "_run", "_tasks", "batches", "writes")

    def __init__(
        self,
        run: Callable[[list[Pending[T, R]]], Awaitable[None]],
        *,
        max_batch: int,
        max_inflight: int,
    ) -> None:
        self._run = run
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._queue: deque[Pending[T, R]] = deque()
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._idle: asyncio.Event | None = None
        self.batches = 0
        self.writes = 0

    async def submit(self, op: T) -> R:
        """Queue ``op`` and wait for its own result (or its own error)."""
        if self._closed:
            raise StoreClosedError("this PostgreSQL store")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append(Pending(op, future))
        if self._inflight < self._max_inflight:
            self._launch()
        return await future

    def _launch(self) -> None:
        batch: list[Pending[T, R]] = []
        while self._queue and len(batch) < self._max_batch:
            item = self._queue.popleft()
            if not item.future.cancelled():  # its caller gave up before it was sent
                batch.append(item)
        if not batch:
            return
        self._inflight += 1
        self.batches += 1
        self.writes += len(batch)
        task = asyncio.create_task(self._execute(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, batch: list[Pending[T, R]]) -> None:
        try:
            await self._run(batch)
        except BaseException as exc:  # the runner must settle; this is the backstop
            for item in batch:
                item.reject(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
        finally:
            self._inflight -= 1
            if self._queue and self._inflight < self._max_inflight:
                self._launch()
            elif not self._queue and self._inflight == 0 and self._idle is not None:
                self._idle.set()

    async def close(self) -> None:
        """Refuse new writes and wait until every queued one has been settled."""
        self._closed = True
        while self._queue or self._inflight:
            if self._inflight < self._max_inflight and self._queue:
                self._launch()
            self._idle = asyncio.Event()
            if not self._queue and self._inflight == 0:
                break
            await self._idle.wait()
