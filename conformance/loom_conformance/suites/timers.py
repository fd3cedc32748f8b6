"""``TestTimerStoreContract``: durable wake-ups (see docs/design.md, "Timers and re-drives")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final

import pytest

from loom_conformance.suites._support import assert_refused_alike_when_closed
from loom_conformance.suites.timers_reference import TimerStoreReferenceContract
from loom_core import (
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    Redrive,
    StoreClosedError,
    TimerRecord,
    TimerStore,
)

__all__ = ["TestTimerStoreContract"]

T0: Final = datetime(2031, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
"""A fixed instant with microseconds: a store that loses precision cannot complete it."""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class TestTimerStoreContract(TimerStoreReferenceContract):
    """Rows keyed by (execution_id, wake_at); re-drive rows upserted with coalesce; drawn
    programs of calls answered as the in-memory reference answers them."""

    pytestmark = pytest.mark.asyncio(loop_scope="function")

    async def test_scheduled_timer_round_trips_in_utc(self, loom_timers: TimerStore) -> None:
        local = at(0).astimezone(timezone(timedelta(hours=2)))
        await loom_timers.schedule(TimerRecord("exec-1", local))
        pending = await loom_timers.pending("exec-1")
        assert pending == (TimerRecord("exec-1", at(0)),)
        assert pending[0].wake_at.utcoffset() == timedelta(0)
        assert pending[0].wake_at.microsecond == 123456

    async def test_redrive_round_trips(self, loom_timers: TimerStore) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(0), Redrive(3)))
        assert await loom_timers.pending("exec-1") == (TimerRecord("exec-1", at(0), Redrive(3)),)
        assert await loom_timers.due(at(0)) == (TimerRecord("exec-1", at(0), Redrive(3)),)

    async def test_schedule_is_idempotent_per_execution_and_wake_at(
        self, loom_timers: TimerStore
    ) -> None:
        for _ in range(3):
            await loom_timers.schedule(TimerRecord("exec-1", at(0)))
        await loom_timers.schedule(TimerRecord("exec-1", at(1)))
        await loom_timers.schedule(TimerRecord("exec-2", at(0)))
        assert await loom_timers.pending("exec-1") == (
            TimerRecord("exec-1", at(0)),
            TimerRecord("exec-1", at(1)),
        )
        assert len(await loom_timers.due(at(10))) == 3

    async def test_a_plain_schedule_never_clears_a_redrive_flag(
        self, loom_timers: TimerStore
    ) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(0), Redrive(2)))
        await loom_timers.schedule(TimerRecord("exec-1", at(0)))
        assert await loom_timers.pending("exec-1") == (TimerRecord("exec-1", at(0), Redrive(2)),)

    async def test_a_plain_row_gains_a_later_redrive_flag(self, loom_timers: TimerStore) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(0)))
        await loom_timers.schedule(TimerRecord("exec-1", at(0), Redrive(0)))
        assert await loom_timers.pending("exec-1") == (TimerRecord("exec-1", at(0), Redrive(0)),)

    async def test_a_later_redrive_schedule_replaces_the_attempt(
        self, loom_timers: TimerStore
    ) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(0), Redrive(0)))
        await loom_timers.schedule(TimerRecord("exec-1", at(0), Redrive(1)))
        assert await loom_timers.pending("exec-1") == (TimerRecord("exec-1", at(0), Redrive(1)),)

    async def test_due_returns_rows_at_or_before_now_ordered_by_time_then_id(
        self, loom_timers: TimerStore
    ) -> None:
        rows = [
            TimerRecord("exec-b", at(2)),
            TimerRecord("exec-a", at(2)),
            TimerRecord("exec-c", at(1), Redrive(0)),
            TimerRecord("exec-a", at(3)),
            TimerRecord("exec-z", at(0)),
            TimerRecord("exec-late", at(60)),
        ]
        for row in rows:
            await loom_timers.schedule(row)
        assert await loom_timers.due(at(3)) == (
            TimerRecord("exec-z", at(0)),
            TimerRecord("exec-c", at(1), Redrive(0)),
            TimerRecord("exec-a", at(2)),
            TimerRecord("exec-b", at(2)),
            TimerRecord("exec-a", at(3)),
        )
        assert await loom_timers.due(at(3), limit=2) == (
            TimerRecord("exec-z", at(0)),
            TimerRecord("exec-c", at(1), Redrive(0)),
        )
        assert await loom_timers.due(at(-1)) == ()

    @pytest.mark.parametrize("redrive", [True, False], ids=["with-redrive", "without"])
    async def test_due_never_returns_a_row_before_its_wake_at(
        self, loom_timers: TimerStore, redrive: bool
    ) -> None:
        """Not a microsecond early: a row is due once ``now`` reaches its ``wake_at``, with
        no rounding of either and no grace period."""
        rows = [
            TimerRecord("exec-a", at(0)),
            TimerRecord("exec-b", at(0.4)),
            TimerRecord("exec-c", at(1.876544)),  # on a whole second
            TimerRecord("exec-d", at(5)),
        ]
        for row in rows:
            await loom_timers.schedule(row)
        for row in rows:
            just_before = row.wake_at - timedelta(microseconds=1)
            early = await loom_timers.due(just_before, redrive=redrive)
            assert row not in early, (
                f"due({just_before.isoformat()}) returned the row waking at "
                f"{row.wake_at.isoformat()}: a row is never due before its wake_at (no "
                "truncation or rounding of times, no grace period)"
            )
            assert row in await loom_timers.due(row.wake_at, redrive=redrive)

    async def test_due_without_redrive_excludes_redrive_rows_before_the_limit(
        self, loom_timers: TimerStore
    ) -> None:
        for i in range(5):
            await loom_timers.schedule(TimerRecord(f"exec-r{i}", at(i), Redrive(i)))
        await loom_timers.schedule(TimerRecord("exec-plain-1", at(10)))
        await loom_timers.schedule(TimerRecord("exec-plain-2", at(11)))

        assert await loom_timers.due(at(20), limit=1, redrive=False) == (
            TimerRecord("exec-plain-1", at(10)),
        )
        assert await loom_timers.due(at(20), limit=5, redrive=False) == (
            TimerRecord("exec-plain-1", at(10)),
            TimerRecord("exec-plain-2", at(11)),
        )
        assert len(await loom_timers.due(at(20), limit=1)) == 1
        assert (await loom_timers.due(at(20), limit=1))[0].redrive == Redrive(0)

    async def test_due_does_not_remove_rows(self, loom_timers: TimerStore) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(0)))
        assert await loom_timers.due(at(0)) == await loom_timers.due(at(0))
        assert len(await loom_timers.pending("exec-1")) == 1

    async def test_complete_retires_one_row(self, loom_timers: TimerStore) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(0)))
        await loom_timers.schedule(TimerRecord("exec-1", at(1), Redrive(0)))
        assert await loom_timers.complete("exec-1", at(0)) is True
        assert await loom_timers.complete("exec-1", at(0)) is False
        assert await loom_timers.complete("exec-1", at(0.5)) is False
        assert await loom_timers.complete("exec-other", at(1)) is False
        assert await loom_timers.pending("exec-1") == (TimerRecord("exec-1", at(1), Redrive(0)),)
        assert await loom_timers.complete("exec-1", at(1)) is True
        assert await loom_timers.pending("exec-1") == ()

    async def test_complete_matches_the_instant_in_any_timezone(
        self, loom_timers: TimerStore
    ) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(0)))
        elsewhere = at(0).astimezone(timezone(timedelta(hours=-5, minutes=-30)))
        assert await loom_timers.complete("exec-1", elsewhere) is True

    async def test_cancel_removes_one_row_or_every_row_of_an_execution(
        self, loom_timers: TimerStore
    ) -> None:
        for i in range(3):
            await loom_timers.schedule(TimerRecord("exec-1", at(i)))
        await loom_timers.schedule(TimerRecord("exec-2", at(0)))
        assert await loom_timers.cancel("exec-1", at(1)) == 1
        assert await loom_timers.cancel("exec-1", at(1)) == 0
        assert [r.wake_at for r in await loom_timers.pending("exec-1")] == [at(0), at(2)]
        assert await loom_timers.cancel("exec-1") == 2
        assert await loom_timers.pending("exec-1") == ()
        assert await loom_timers.pending("exec-2") == (TimerRecord("exec-2", at(0)),)
        assert await loom_timers.cancel("exec-none") == 0

    async def test_pending_cancel_and_complete_match_the_execution_id_exactly(
        self, loom_timers: TimerStore
    ) -> None:
        """An id is a whole value: never a prefix, a pattern (``%``, ``_``), nor
        case-folded."""
        ids = ["exec-1", "exec-10", "exec-1-child", "EXEC-1", "exec_1", "exec%", "exec"]
        for execution_id in ids:
            await loom_timers.schedule(TimerRecord(execution_id, at(0)))
            await loom_timers.schedule(TimerRecord(execution_id, at(1)))
        for execution_id in ids:
            got = await loom_timers.pending(execution_id)
            assert got == (TimerRecord(execution_id, at(0)), TimerRecord(execution_id, at(1))), (
                f"pending({execution_id!r}) gave the rows of "
                f"{[(r.execution_id, r.wake_at.isoformat()) for r in got]}: it returns "
                "that execution's rows only, matching the id exactly"
            )

        assert await loom_timers.complete("exec", at(0)) is True
        assert await loom_timers.cancel("exec%", at(1)) == 1
        assert await loom_timers.cancel("exec-1") == 2, "cancel counts only exec-1's rows"
        for execution_id in ids[1:]:
            left = len(await loom_timers.pending(execution_id))
            expected = 1 if execution_id in ("exec", "exec%") else 2
            assert left == expected, (
                f"{execution_id!r} has {left} row(s) left, not {expected}, after complete("
                "'exec', …), cancel('exec%', …) and cancel('exec-1'): they touch only the "
                "rows of the id they name, matched exactly"
            )

    async def test_naive_datetimes_are_refused_and_change_nothing(
        self, loom_timers: TimerStore
    ) -> None:
        await _every_call_refuses(loom_timers, datetime(2031, 3, 4, 5, 6, 7))

    async def test_datetimes_beyond_the_years_utc_can_hold_are_refused_and_change_nothing(
        self, loom_timers: TimerStore
    ) -> None:
        await _every_call_refuses(
            loom_timers,
            datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
            datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
        )

    async def test_bad_timer_input_is_refused_and_changes_nothing(
        self, loom_timers: TimerStore
    ) -> None:
        bad_records: list[Any] = [
            TimerRecord("", at(0)),
            TimerRecord("nul\x00id", at(0)),
            TimerRecord(42, at(0)),  # type: ignore[arg-type]
            TimerRecord("exec-1", "2031-03-04T05:06:07Z"),  # type: ignore[arg-type]
            TimerRecord("exec-1", at(0), Redrive(-1)),
            TimerRecord("exec-1", at(0), Redrive(True)),
            TimerRecord("exec-1", at(0), {"attempt": 1}),  # type: ignore[arg-type]
            ("exec-1", at(0)),
        ]
        for record in bad_records:
            with pytest.raises(InvalidInputError):
                await loom_timers.schedule(record)
        with pytest.raises(InvalidExecutionIdError):
            await loom_timers.pending("bad\x00id")
        for limit in (0, True, "5"):
            lim: Any = limit
            with pytest.raises(InvalidOptionError):
                await loom_timers.due(at(0), limit=lim)
        flag: Any = "no"
        with pytest.raises(InvalidOptionError):
            await loom_timers.due(at(0), redrive=flag)
        assert await loom_timers.due(at(100)) == ()

    async def test_close_is_idempotent(self, loom_timers: TimerStore) -> None:
        await loom_timers.close()
        await loom_timers.close()

    async def test_every_method_after_close_raises_store_closed(
        self, loom_timers: TimerStore
    ) -> None:
        await loom_timers.schedule(TimerRecord("exec-1", at(1)))
        await loom_timers.close()
        calls: tuple[Callable[[], Awaitable[object]], ...] = (
            lambda: loom_timers.schedule(TimerRecord("exec-1", at(2))),
            lambda: loom_timers.due(at(10)),
            lambda: loom_timers.pending("exec-1"),
            lambda: loom_timers.complete("exec-1", at(1)),
            lambda: loom_timers.cancel("exec-1"),
        )
        for call in calls:
            with pytest.raises(StoreClosedError):
                await call()

    async def test_bad_input_on_a_closed_store_is_refused_as_bad_input(
        self, loom_timers: TimerStore
    ) -> None:
        """Arguments are checked before the store is: a bad argument raises the same
        InvalidInputError on a closed store as on an open one, never StoreClosedError."""
        naive = datetime(2031, 1, 1)
        bad: Any = naive
        calls: tuple[tuple[str, Callable[[], Awaitable[object]]], ...] = (
            ("schedule, empty id", lambda: loom_timers.schedule(TimerRecord("", at(1)))),
            ("schedule, naive wake_at", lambda: loom_timers.schedule(TimerRecord("exec-1", bad))),
            ("due, naive now", lambda: loom_timers.due(bad)),
            ("due, limit 0", lambda: loom_timers.due(at(10), limit=0)),
            ("due, redrive not a bool", lambda: loom_timers.due(at(10), redrive=bad)),
            ("pending, empty id", lambda: loom_timers.pending("")),
            ("complete, empty id", lambda: loom_timers.complete("", at(1))),
            ("complete, naive wake_at", lambda: loom_timers.complete("exec-1", bad)),
            ("cancel, empty id", lambda: loom_timers.cancel("")),
            ("cancel, naive wake_at", lambda: loom_timers.cancel("exec-1", bad)),
        )
        await assert_refused_alike_when_closed(calls, loom_timers.close, "timer store")


async def _every_call_refuses(timers: TimerStore, *instants: datetime) -> None:
    """Each of ``instants`` is refused by every timer call with InvalidOptionError, and
    the rows stay as they were."""
    await timers.schedule(TimerRecord("exec-1", at(0)))
    for instant in instants:
        with pytest.raises(InvalidOptionError):
            await timers.schedule(TimerRecord("exec-2", instant))
        with pytest.raises(InvalidOptionError):
            await timers.due(instant)
        with pytest.raises(InvalidOptionError):
            await timers.complete("exec-1", instant)
        with pytest.raises(InvalidOptionError):
            await timers.cancel("exec-1", instant)
    assert await timers.pending("exec-1") == (TimerRecord("exec-1", at(0)),)
    assert await timers.pending("exec-2") == ()
