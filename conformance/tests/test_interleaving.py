"""The interleaving of real code at its store calls: one call per letter, crashes at the
end of the word, every distinct schedule once, and the model's refusals."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime

import pytest
from loom_conformance.explorer import (
    GatedEventStore,
    Interleaving,
    Played,
    ScheduleError,
    every_interleaving,
)

from loom_core import EventStore, NewEvent, Storage, TimerRecord, TimerStore, open_storage

asyncio_test = pytest.mark.asyncio(loop_scope="function")


async def writes(store: EventStore, execution_id: str, count: int) -> int:
    """An actor: ``count`` appends, one after the other; returns how many it made."""
    for sequence in range(count):
        await store.append(execution_id, [NewEvent("test.step")], expected_sequence=sequence)
    return count


async def memory() -> Storage:
    return await open_storage("memory://")


@asyncio_test
async def test_each_letter_lets_one_store_call_through_in_the_order_of_the_word() -> None:
    async with await memory() as storage:
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)
        played = await interleaving.play(
            "ABBA", {"A": lambda: writes(gated, "a", 3), "B": lambda: writes(gated, "b", 3)}
        )
        assert [(c.actor, c.method, c.execution_id, c.arguments["at"]) for c in played.calls] == [
            ("A", "append", "a", 0), ("B", "append", "b", 0),
            ("B", "append", "b", 1), ("A", "append", "a", 1),
        ]
        # Both crashed at their third call, which never reached the store.
        assert played.crashed == {"A", "B"}
        assert played.outcomes["A"].pending.startswith("append('a'")
        assert await storage.events.head("a") == 2
        assert await storage.events.head("b") == 2


@asyncio_test
async def test_an_actor_that_finishes_returns_and_later_letters_for_it_are_no_ops() -> None:
    async with await memory() as storage:
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)
        played = await interleaving.play("AAAAA", {"A": lambda: writes(gated, "a", 2)})
        assert played.crashed == frozenset()
        assert played.outcomes["A"].kind == "returned"
        assert played.outcomes["A"].value == 2
        assert len(played.calls) == 2


@asyncio_test
async def test_a_refused_call_is_recorded_with_its_error_and_raised_to_the_actor() -> None:
    async with await memory() as storage:
        await storage.events.append("a", [NewEvent("test.first")], expected_sequence=0)
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)
        played = await interleaving.play("A", {"A": lambda: writes(gated, "a", 1)})
        (call,) = played.calls
        assert call.refused
        assert call.written() == ()
        assert played.outcomes["A"].kind == "raised"
        assert played.outcomes["A"].error is call.error


@asyncio_test
async def test_a_crashed_actor_that_catches_the_cancellation_still_writes_nothing() -> None:
    async with await memory() as storage:
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)

        async def stubborn() -> None:
            try:
                await writes(gated, "a", 1)
            except asyncio.CancelledError:
                await writes(gated, "a", 1)  # a crashed process makes no more calls

        played = await interleaving.play("", {"A": stubborn})
        assert played.crashed == {"A"}
        assert await storage.events.head("a") == 0


@asyncio_test
async def test_calls_made_outside_any_actor_go_straight_to_the_store() -> None:
    async with await memory() as storage:
        gated = Interleaving().gate(storage.events)
        assert await writes(gated, "a", 2) == 2
        assert await gated.head("a") == 2
        assert gated.capabilities == storage.events.capabilities


@asyncio_test
async def test_the_gate_offers_what_the_store_below_offers() -> None:
    async with await open_storage("memory://", options={"offer": ("acquire_fence",)}) as s:
        gated = Interleaving().gate(s.events)
        assert isinstance(gated, GatedEventStore)
        assert gated.capabilities == frozenset({"acquire_fence"})


@asyncio_test
async def test_every_interleaving_plays_each_distinct_schedule_once() -> None:
    async with await memory() as storage:
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)
        count = 0

        async def play(word: str) -> Played:
            nonlocal count
            count += 1
            return await interleaving.play(
                word,
                {"A": lambda: writes(gated, f"a{count}", 2),
                 "B": lambda: writes(gated, f"b{count}", 3)},
            )

        words = [p.word async for p in every_interleaving(play)]
        # Every prefix of every interleaving of A's 2 calls and B's 3: sum over i <= 2,
        # j <= 3 of C(i + j, i), which is C(2 + 3 + 2, 2 + 1) - 1.
        assert len(words) == len(set(words)) == math.comb(7, 3) - 1
        assert all(w.count("A") <= 2 and w.count("B") <= 3 for w in words)
        bounded = [p.word async for p in every_interleaving(play, max_steps=2)]
        assert sorted(bounded) == ["", "A", "AA", "AB", "B", "BA", "BB"]


@asyncio_test
async def test_an_actor_making_two_store_calls_at_once_is_refused() -> None:
    async with await memory() as storage:
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)

        async def both() -> None:
            await asyncio.gather(writes(gated, "a", 1), writes(gated, "b", 1))

        with pytest.raises(ScheduleError, match="one store call at a time"):
            await interleaving.play("AA", {"A": both})


@asyncio_test
async def test_an_actor_that_waits_on_anything_but_the_store_is_reported_hung() -> None:
    async with await memory() as storage:
        interleaving = Interleaving(guard_seconds=0.05)
        gated = interleaving.gate(storage.events)
        never = asyncio.Event()

        async def stuck() -> None:
            await writes(gated, "a", 1)
            await never.wait()

        with pytest.raises(ScheduleError, match="neither called the store nor finished"):
            await interleaving.play("A", {"A": stuck})


@asyncio_test
async def test_a_task_an_actor_left_behind_is_refused_when_it_calls_the_store() -> None:
    async with await memory() as storage:
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)
        left: list[asyncio.Task[int]] = []

        async def careless() -> None:
            left.append(asyncio.create_task(writes(gated, "a", 1)))

        with pytest.raises(ScheduleError, match="must await everything it starts"):
            await interleaving.play("A", {"A": careless})
        await asyncio.gather(*left, return_exceptions=True)
        assert await storage.events.head("a") == 0


@asyncio_test
async def test_a_word_must_name_the_actors_by_one_letter() -> None:
    interleaving = Interleaving()
    with pytest.raises(ScheduleError, match="one letter"):
        await interleaving.play("", {"AB": lambda: asyncio.sleep(0)})
    with pytest.raises(ScheduleError, match="names no actor"):
        await interleaving.play("C", {"A": lambda: asyncio.sleep(0)})


class SlowTimers:
    """A timer store whose ``schedule`` does its work in a thread, as a file-backed one does."""

    def __init__(self, inner: TimerStore) -> None:
        self.inner = inner
        self.scheduled = 0

    async def schedule(self, record: TimerRecord) -> None:
        await asyncio.to_thread(time.sleep, 0.01)
        await self.inner.schedule(record)
        self.scheduled += 1

    async def due(
        self, now: datetime, *, limit: int = 100, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        return await self.inner.due(now, limit=limit, redrive=redrive)

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        return await self.inner.pending(execution_id)

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        return await self.inner.complete(execution_id, wake_at)

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        return await self.inner.cancel(execution_id, wake_at)

    async def close(self) -> None:
        await self.inner.close()


@asyncio_test
async def test_an_actor_is_not_blocked_while_its_timer_call_is_under_way() -> None:
    """The actor's own task is in a timer call (I/O in a thread) while a task it started
    already waits at the gate: the schedule waits for the timer call, then the crash
    stops both tasks, and the gated call never reaches the store."""
    async with await memory() as storage:
        interleaving = Interleaving()
        gated = interleaving.gate(storage.events)
        slow = SlowTimers(storage.timers)
        timers = interleaving.track(slow)
        wake = TimerRecord("a", datetime(2030, 1, 1, tzinfo=UTC))

        async def fan_out() -> None:
            started = asyncio.create_task(writes(gated, "a", 1))
            await asyncio.sleep(0)  # the started task reaches the gate first
            await timers.schedule(wake)
            await started

        played = await interleaving.play("", {"A": fan_out})
        assert slow.scheduled == 1
        assert played.crashed == {"A"}
        assert await storage.events.head("a") == 0
        played = await interleaving.play("A", {"A": fan_out})
        assert played.outcomes["A"].kind == "returned"
        assert await storage.events.head("a") == 1
