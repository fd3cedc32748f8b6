"""One execution the runtime cannot read or take over (its payloads shredded, a shard it
lives on down) holds up no other: the timer service backs its row off and fires the rows
behind it, and recovery takes every other execution over, carrying the failed one on once
the store answers. A recovery on entering that cannot list the executions is made again."""

from __future__ import annotations

import logging
import random
from datetime import timedelta

import pytest
from loom_runtime import Context, Loom
from loom_runtime.app import CARRY_ON_CAP
from loom_runtime.records import started
from loom_runtime.testing import VirtualClock
from store_probes import ProbedEventStore, kinds, wired

from loom_core import (
    EventKind,
    LoomError,
    PayloadShreddedError,
    Storage,
    StorageReadError,
    StorageUnavailableError,
    open_storage,
)


def failing_reads(probe: ProbedEventStore, failures: dict[str, LoomError]) -> None:
    """Every read of an execution named in ``failures`` raises its error (while named)."""

    def after_read(execution_id: str) -> None:
        error = failures.get(execution_id)
        if error is not None:
            raise error

    probe.after_read = after_read


async def left_behind(ctx: Context) -> str:
    return "recovered"


def started_by(node: str, root: str) -> list[object]:
    return [started("left", [], fingerprint="", node=node, root=root)]


async def test_a_row_whose_execution_cannot_be_read_holds_up_no_row_behind_it() -> None:
    async with wired() as w:
        for execution_id in ("a", "b"):
            await w.app.start("nap", id=execution_id)
        await w.app.drain()
        shredded = PayloadShreddedError("a", 0, "key-alice")
        failures: dict[str, LoomError] = {"a": shredded}
        failing_reads(w.probe, failures)
        await w.clock.advance(60)
        service = w.app.timer_service
        fired = {row.execution_id: what for row, what in (await service.poll_once()).items()}
        assert fired == {"a": "backing-off", "b": "resumed"}
        assert await w.app.get("b").result(timeout=5) == "awake"
        # Tried again after its backoff, and reported once for the run of failures.
        await w.clock.advance(3600)
        fired = {row.execution_id: what for row, what in (await service.poll_once()).items()}
        assert fired == {"a": "backing-off"}
        assert w.errors == [shredded]
        # Readable again (a shard came back, say): the next try after the backoff wakes it.
        failures.clear()
        await w.clock.advance(3600)
        fired = {row.execution_id: what for row, what in (await service.poll_once()).items()}
        assert fired == {"a": "resumed"}
        assert await w.app.get("a").result(timeout=5) == "awake"


async def test_a_row_whose_execution_is_readable_again_logs_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tries of a row whose execution cannot be read: the first to on_error, the
    others to DEBUG, and one INFO line when the row wakes its execution again."""
    caplog.set_level(logging.DEBUG, logger="loom_runtime")
    async with wired() as w:
        await w.app.start("nap", id="a")
        await w.app.drain()
        shredded = PayloadShreddedError("a", 0, "key-alice")
        failures: dict[str, LoomError] = {"a": shredded}
        failing_reads(w.probe, failures)
        service = w.app.timer_service
        await w.clock.advance(60)
        for _ in range(5):
            await service.poll_once()
            await w.clock.advance(3600)
        assert w.errors == [shredded]
        again = [r for r in caplog.records if r.levelno == logging.DEBUG
                 and "failed again" in r.getMessage()]
        assert len(again) == 4
        assert not [r for r in caplog.records if r.levelno == logging.INFO]
        failures.clear()
        fired = {row.execution_id: what for row, what in (await service.poll_once()).items()}
        assert fired == {"a": "resumed"}
        back = [r for r in caplog.records if r.levelno == logging.INFO]
        assert [r.getMessage() for r in back] == [
            "the timer row of 'a' wakes it again, after 5 failed tries"
        ]
        assert back[0].execution_id == "a"  # type: ignore[attr-defined]


async def test_recovery_takes_over_every_execution_it_can_and_carries_on_the_rest() -> None:
    async with wired() as w:
        w.app.workflow(name="left")(left_behind)
        for execution_id in ("shredded", "unreadable", "z"):
            await w.base.events.append(
                execution_id, started_by(w.app.node, execution_id),  # type: ignore[arg-type]
                expected_sequence=0, fence=0,
            )
        shredded = PayloadShreddedError("shredded", 0, "key-alice")
        unreadable = StorageReadError("the shard holding 'unreadable' did not answer")
        failures: dict[str, LoomError] = {"shredded": shredded, "unreadable": unreadable}
        failing_reads(w.probe, failures)
        handles = await w.app.recover()
        assert [h.execution_id for h in handles] == ["z"]
        assert await handles[0].result(timeout=5) == "recovered"
        assert w.errors == [shredded]  # left: a refusal that no retry ends
        assert w.app.stranded == frozenset({"unreadable"})  # carried on once it answers
        failures.pop("unreadable")
        await w.clock.advance(CARRY_ON_WAIT)
        await w.app.drain()
        assert await w.app.get("unreadable").result(timeout=5) == "recovered"
        assert w.app.stranded == frozenset()
        assert await kinds(w.base.events, "shredded") == [EventKind.EXECUTION_STARTED]


CARRY_ON_WAIT = timedelta(seconds=1)  # the carry-on's first wait is at most this


async def test_a_recovery_on_entering_that_cannot_list_the_executions_is_made_again() -> None:
    async with open_storage("memory://") as base:
        await base.events.append(
            "y", started_by("n1", "y"), expected_sequence=0, fence=0  # type: ignore[arg-type]
        )
        probe = ProbedEventStore(base.events)
        down = StorageUnavailableError("shard 1 refused the connection")
        listing_fails = [down]

        def after_list() -> None:
            if listing_fails:
                raise listing_fails.pop()

        probe.after_list = after_list
        storage = Storage(probe, base.timers, base.leases)
        clock = VirtualClock()
        errors: list[BaseException] = []
        app = Loom(storage, node="n1", clock=clock, random=random.Random(3),
                   on_error=errors.append, timers=False)
        app.workflow(name="left")(left_behind)
        async with app:
            await app.drain()  # the recovery on entering ran, and could not list
            assert errors == [down]
            assert await app.get("y").status() == "running"
            await clock.advance(CARRY_ON_WAIT)  # the carry-on lists again
            await app.drain()
            assert await app.get("y").result(timeout=5) == "recovered"
            assert errors == [down]


async def test_a_listing_that_keeps_failing_is_reported_once_and_its_end_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store down for hours fails the carry-on's listing every 30 s: on_error hears of
    the first failure (and of one of another type), the tries after it go to DEBUG, and
    the listing that answers again is logged once at INFO."""
    async with open_storage("memory://") as base:
        await base.events.append(
            "y", started_by("n1", "y"), expected_sequence=0, fence=0  # type: ignore[arg-type]
        )
        probe = ProbedEventStore(base.events)
        down = StorageUnavailableError("shard 1 refused the connection")
        failing: list[LoomError] = [down]

        def after_list() -> None:
            if failing:
                raise failing[0]

        probe.after_list = after_list
        storage = Storage(probe, base.timers, base.leases)
        clock = VirtualClock()
        errors: list[BaseException] = []
        app = Loom(storage, node="n1", clock=clock, random=random.Random(3),
                   on_error=errors.append, timers=False)
        app.workflow(name="left")(left_behind)
        caplog.set_level(logging.DEBUG, logger="loom_runtime")
        async with app:
            await app.drain()
            for _ in range(120):  # an hour of tries
                await clock.advance(CARRY_ON_CAP)
                await app.drain()
            assert errors == [down]
            other = StorageReadError("shard 1 answered garbage")
            failing[0] = other  # another type of failure is reported too
            for _ in range(10):
                await clock.advance(CARRY_ON_CAP)
                await app.drain()
            assert errors == [down, other]
            assert not [r for r in caplog.records if r.levelno == logging.INFO]
            failing.clear()
            await clock.advance(CARRY_ON_CAP)
            await app.drain()
            assert await app.get("y").result(timeout=5) == "recovered"
            assert errors == [down, other]
            back = [r for r in caplog.records if r.levelno == logging.INFO]
            assert len(back) == 1
            assert "lists the executions again" in back[0].getMessage()
            repeats = [r for r in caplog.records if r.levelno == logging.DEBUG
                       and "failed again" in r.getMessage()]
            assert len(repeats) > 100


async def test_a_listing_that_fails_at_the_next_entry_is_reported_again() -> None:
    """The app is left while the store still fails its listings, and entered again with
    the store down: that entry's recovery is a new one, and on_error hears of its first
    failure as it did of the first entry's (the repeats it does not hear of belong to one
    entry's outage)."""
    async with open_storage("memory://") as base:
        probe = ProbedEventStore(base.events)
        down = StorageUnavailableError("shard 1 refused the connection")
        failing: list[LoomError] = [down]

        def after_list() -> None:
            if failing:
                raise failing[0]

        probe.after_list = after_list
        storage = Storage(probe, base.timers, base.leases)
        clock = VirtualClock()
        errors: list[BaseException] = []
        app = Loom(storage, node="n1", clock=clock, random=random.Random(3),
                   on_error=errors.append, timers=False)
        app.workflow(name="left")(left_behind)
        async with app:
            await app.drain()
            assert errors == [down]
        again = StorageUnavailableError("shard 1 is still down")
        failing[0] = again
        async with app:
            await app.drain()
            assert errors == [down, again]
