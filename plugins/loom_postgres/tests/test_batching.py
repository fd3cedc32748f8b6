"""Group commit on its own (no server): a write that may leave at once runs alone in its
caller's task; writes that arrive while batches are in flight queue and leave together in
a task of their own; each gets its own result or error; ``close`` waits for all of it.

Every runner here blocks on an event the test sets, so which writes share a batch is
decided by the test, never by the scheduler."""

from __future__ import annotations

import asyncio

import pytest
from loom_postgres.batching import GroupCommitter, Pending

from loom_core.errors import StoreClosedError


class Runner:
    """Records each batch (its writes and the task that ran it) and answers ``op * 10``,
    or raises the op's error; waits for ``gate`` first when one is set."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[int], asyncio.Task[object] | None]] = []
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def __call__(self, batch: list[Pending[int, int]]) -> None:
        self.batches.append(([item.op for item in batch], asyncio.current_task()))
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        for item in batch:
            if item.op < 0:
                item.reject(ValueError(f"write {item.op} refused"))
            else:
                item.resolve(item.op * 10)


def committer(runner: Runner, *, max_inflight: int = 1) -> GroupCommitter[int, int]:
    return GroupCommitter(runner, max_batch=256, max_inflight=max_inflight)


async def test_a_write_with_nothing_in_flight_runs_alone_in_the_callers_own_task() -> None:
    runner = Runner()
    commits = committer(runner)

    async def caller() -> tuple[int, asyncio.Task[object] | None]:
        return await commits.submit(4), asyncio.current_task()

    result, task = await asyncio.create_task(caller())
    assert result == 40
    assert runner.batches == [([4], task)]
    assert (commits.batches, commits.writes) == (1, 1)


async def test_writes_that_arrive_while_a_batch_is_in_flight_leave_together() -> None:
    runner = Runner()
    runner.gate = asyncio.Event()
    commits = committer(runner)
    first = asyncio.create_task(commits.submit(1))
    await runner.started.wait()  # the lone write is on the wire, holding the one slot
    queued = [asyncio.create_task(commits.submit(n)) for n in (2, 3, -4)]
    for _ in range(3):
        await asyncio.sleep(0)  # each queued caller reaches its await
    assert len(runner.batches) == 1
    runner.gate.set()
    assert await first == 10
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert results[:2] == [20, 30]
    assert isinstance(results[2], ValueError)  # its own error, not its batch mates'
    assert [ops for ops, _ in runner.batches] == [[1], [2, 3, -4]]
    ran_queued = runner.batches[1][1]
    assert ran_queued is not None
    assert ran_queued not in {first, *queued}  # a task of the committer's own
    assert (commits.batches, commits.writes) == (2, 4)


async def test_a_lone_write_keeps_its_own_error() -> None:
    commits = committer(Runner())
    with pytest.raises(ValueError, match="write -1 refused"):
        await commits.submit(-1)
    assert await commits.submit(2) == 20  # the slot was given back


async def test_a_runner_that_settles_nothing_fails_the_lone_write_instead_of_hanging() -> None:
    async def broken(batch: list[Pending[int, int]]) -> None:
        raise RuntimeError("runner bug")

    commits: GroupCommitter[int, int] = GroupCommitter(broken, max_batch=8, max_inflight=1)
    with pytest.raises(RuntimeError, match="runner bug"):
        await commits.submit(1)


async def test_cancelling_a_lone_write_gives_its_slot_back() -> None:
    runner = Runner()
    runner.gate = asyncio.Event()
    commits = committer(runner)
    lone = asyncio.create_task(commits.submit(1))
    await runner.started.wait()
    lone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lone
    runner.gate.set()
    assert await commits.submit(2) == 20  # ran at once: nothing is in flight any more
    assert [ops for ops, _ in runner.batches] == [[1], [2]]


async def test_close_waits_for_the_lone_write_in_flight_then_refuses_new_ones() -> None:
    runner = Runner()
    runner.gate = asyncio.Event()
    commits = committer(runner)
    lone = asyncio.create_task(commits.submit(5))
    await runner.started.wait()
    closing = asyncio.create_task(commits.close())
    await asyncio.sleep(0)
    assert not closing.done()  # the write is still running
    runner.gate.set()
    await closing
    assert lone.done()
    assert await lone == 50
    with pytest.raises(StoreClosedError):
        await commits.submit(6)
