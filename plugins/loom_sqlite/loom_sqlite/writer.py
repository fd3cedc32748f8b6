"""The storage's own thread: runs jobs on its connection, one at a time, in order.

A job is a plain function; the thread runs it and hands its result (or the exception it
raised) back to the event loop with **one** ``call_soon_threadsafe`` per job, so a job
that runs a whole batch of operations wakes the loop once for all of them. Nothing else
crosses threads: the queue is a ``SimpleQueue`` of jobs, the answer one callback.

The thread is a daemon: a storage that was never closed does not keep the interpreter
alive, and a commit cut short by the process ending is rolled back by SQLite when the file
is next opened (a commit is atomic, so it is either in the file or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Generic, TypeVar, final

__all__ = ["Outcome", "WriterThread"]

T = TypeVar("T")


@final
class Outcome(Generic[T]):
    """What a job returned, or the exception it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: T | None, error: BaseException | None) -> None:
        self.value = value
        self.error = error


def _stop_job() -> None:
    """The job that ends the thread, in place of running."""


_Job = tuple[
    Callable[[], object],
    Callable[[Outcome[object]], None],
    asyncio.AbstractEventLoop,
]


@final
class WriterThread:
    """One thread, one FIFO of jobs; see the module docstring."""

    __slots__ = ("_jobs", "_stopped", "_thread")

    def __init__(self, name: str) -> None:
        self._jobs: SimpleQueue[_Job] = SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(
        self,
        job: Callable[[], T],
        done: Callable[[Outcome[T]], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Run ``job`` after the jobs before it; then ``done(outcome)`` on ``loop``."""
        if self._stopped:
            raise RuntimeError("the writer thread has stopped")
        self._jobs.put((job, done, loop))  # type: ignore[arg-type]

    async def call(self, job: Callable[[], T]) -> T:
        """Run ``job`` on the thread and return its result (or raise its error)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def done(outcome: Outcome[T]) -> None:
            if future.cancelled():
                return
            if outcome.error is not None:
                future.set_exception(outcome.error)
            else:
                future.set_result(outcome.value)  # type: ignore[arg-type]

        self.submit(job, done, loop)
        return await future

    async def stop(self, last: Callable[[], None]) -> None:
        """Run ``last`` after every queued job, then end the thread and return once it has
        ended. Idempotent.

        It waits for the end because a thread left running, even idle, makes a fork
        right after the close unsafe (Python 3.12 and later warn of it): the child
        would get a copy of whatever lock that thread held.
        """
        if self._stopped:
            return
        try:
            await self.call(last)
        finally:
            self._stopped = True
            loop = asyncio.get_running_loop()
            ended: asyncio.Future[None] = loop.create_future()

            def done(outcome: Outcome[object]) -> None:
                if not ended.done():
                    ended.set_result(None)

            self._jobs.put((_stop_job, done, loop))
        await ended
        # The thread's last act was to tell us: the join only waits for it to return.
        self._thread.join()

    def _run(self) -> None:
        while True:
            job, done, loop = self._jobs.get()
            if job is _stop_job:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(done, Outcome(None, None))
                return
            try:
                outcome: Outcome[object] = Outcome(job(), None)
            except BaseException as exc:  # handed to the caller, who raises it
                outcome = Outcome(None, exc)
            # A loop that closed while the job ran leaves nobody to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done, outcome)
