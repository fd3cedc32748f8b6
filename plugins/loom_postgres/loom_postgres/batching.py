"""Group commit: concurrent writes share one round-trip and one commit.

While fewer than ``max_inflight`` batches are running, a write leaves at once, so a lone
writer waits for nobody: it runs as a batch of one in the caller's own task (no queue, no
task to hand it to, no wake-up on the way back), and counts as a batch in flight while it
does. Under load the writes that arrive while batches are in flight are queued with a
future each, accumulate, and leave together in the next batch (up to ``max_batch``), run
by a task of its own. The batch runner settles every write on its own: one write's
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
        """Run ``op`` (at once when a batch may leave, else queued) and return its own
        result, or raise its own error.

        A write that may leave at once has nothing queued to share its batch (the queue
        fills only while ``max_inflight`` batches run), so it runs alone in this task.
        Cancelling the caller then cancels its statement: PostgreSQL has either committed
        it whole or rolled it back whole, and the caller, cancelled, learns neither."""
        if self._closed:
            raise StoreClosedError("this PostgreSQL store")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        item = Pending(op, future)
        if self._queue or self._inflight >= self._max_inflight:
            self._queue.append(item)
            if self._inflight < self._max_inflight:
                self._launch()
            return await future
        self._inflight += 1
        self.batches += 1
        self.writes += 1
        try:
            await self._run([item])
        except Exception as exc:  # the runner must settle; this is the backstop
            item.reject(exc)
        finally:
            self._finished()
        return future.result()

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
            self._finished()

    def _finished(self) -> None:
        """A batch is done: launch what queued meanwhile, or tell ``close`` all is."""
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
