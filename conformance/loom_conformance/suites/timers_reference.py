"""The timer store under test against the in-memory reference, on drawn sequences of calls.

Hypothesis draws a short program of timer-store calls over two executions and four wake
times: ``schedule`` of plain and re-drive rows, once or twice in a row for one row (so a
plain schedule meets a re-drive row and a re-drive meets a plain one), ``due`` at a drawn
instant with a small limit, with and without re-drive rows, ``pending``, ``complete`` and
``cancel`` of one row or of all. Each call is made on the store under test and on a fresh
:class:`~loom_core.memory.MemoryTimerStore` (the kernel's reference); both must answer
alike, and at the end both executions' rows must be the same.

``due`` sees every row of the store, so each example ends by cancelling its executions'
rows on both stores, whatever happened: the next example starts from an empty store.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeAlias

from hypothesis import event, given
from hypothesis import strategies as st

from loom_conformance.suites._support import drawn_settings
from loom_core import LoomError, Redrive, TimerRecord, TimerStore
from loom_core.memory import MemoryTimerStore

__all__ = ["TimerStoreReferenceContract"]

EXAMPLES: Final = 100
"""Programs per run of the suite (the same ones every run)."""
IDS: Final = ("a", "b")
T0: Final = datetime(2031, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
_EXAMPLE: Final = itertools.count()

Call: TypeAlias = tuple[Any, ...]

_ids = st.sampled_from(range(len(IDS)))
_times = st.sampled_from([0, 1, 2, 5])
_attempt = st.one_of(st.none(), st.integers(min_value=0, max_value=3))
_calls = st.one_of(
    st.tuples(st.just("schedule"), _ids, _times, _attempt),
    # The same row scheduled twice, so a plain schedule meets a re-drive row and back.
    st.tuples(st.just("reschedule"), _ids, _times, _attempt, _attempt),
    st.tuples(
        st.just("due"), st.sampled_from([-1, 0, 1, 2, 5, 9]),
        st.integers(min_value=1, max_value=4), st.booleans(),
    ),
    st.tuples(st.just("pending"), _ids),
    st.tuples(st.just("complete"), _ids, _times),
    st.tuples(st.just("cancel"), _ids, st.one_of(st.none(), _times)),
)


def _at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def _answer(store: TimerStore, prefix: str, call: Call) -> object:
    """Make ``call`` on ``store``; its answer, or its refusal's class."""
    name = call[0]
    try:
        if name in ("schedule", "reschedule"):
            _, i, wake, *attempts = call
            for attempt in attempts:
                redrive = None if attempt is None else Redrive(attempt)
                await store.schedule(TimerRecord(prefix + IDS[i], _at(wake), redrive))
            return await store.pending(prefix + IDS[i])
        if name == "due":
            _, now, limit, redrive = call
            return await store.due(_at(now), limit=limit, redrive=redrive)
        if name == "pending":
            return await store.pending(prefix + IDS[call[1]])
        if name == "complete":
            return await store.complete(prefix + IDS[call[1]], _at(call[2]))
        assert name == "cancel", call
        _, i, wake = call
        return await store.cancel(prefix + IDS[i], None if wake is None else _at(wake))
    except LoomError as refused:
        return type(refused).__name__


class TimerStoreReferenceContract:
    """Drawn programs of calls: the timer store under test answers as the in-memory
    reference does, call by call, and ends with the same rows (see the module docstring)."""

    @drawn_settings(EXAMPLES)
    @given(data=st.data())
    async def test_drawn_calls_answer_as_the_reference_does(
        self, loom_timers: TimerStore, data: st.DataObject
    ) -> None:
        program = data.draw(st.lists(_calls, min_size=4, max_size=16), label="program")
        reference = MemoryTimerStore()
        prefix = f"ref-{next(_EXAMPLE)}-"
        try:
            for step, call in enumerate(program):
                expected = await _answer(reference, prefix, call)
                answered = await _answer(loom_timers, prefix, call)
                event(f"{call[0]}: {expected if isinstance(expected, str) else 'answered'}")
                assert answered == expected, (
                    f"call {step} {call!r}: the store answered {answered!r}, "
                    f"the reference {expected!r}"
                )
            for execution_id in (prefix + i for i in IDS):
                assert await loom_timers.pending(execution_id) == await reference.pending(
                    execution_id
                )
        finally:
            for execution_id in (prefix + i for i in IDS):
                await loom_timers.cancel(execution_id)
            await reference.close()
