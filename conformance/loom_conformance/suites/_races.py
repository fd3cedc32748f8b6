"""Races forced, not hoped for: a second call made at each point where a first one may
be suspended inside the store.

A store call that awaits between its check and its write (two statements outside one
transaction, a lock taken after the read) leaves a gap that another caller can write
into. The kit cannot see inside a store, so it starts the first call, gives it a head
start of ``0, 1, …, MAX_TURNS - 1`` loop turns, and only then starts the second: an
in-process store suspended at an await inside its call is caught at every such await
reached within those turns, on every run, since asyncio runs ready tasks in the order
they became ready. A store that makes the call one atomic step (no await between check
and write, or one SQL transaction) passes whatever the head start, so a test over these
outcomes asserts only what every serial order allows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from loom_conformance.suites._support import guard

__all__ = ["MAX_TURNS", "Race", "race_after_turns"]

MAX_TURNS: Final = 8
"""The longest head start, in loop turns, the first call is given before the second
starts: more awaits than an in-process store makes before its write."""

_A = TypeVar("_A")
_B = TypeVar("_B")


@dataclass(frozen=True, slots=True)
class Race(Generic[_A, _B]):
    """What each call of one race gave: its result, or the exception it raised."""

    turns: int
    first: _A | Exception
    second: _B | Exception


async def race_after_turns(
    first: Awaitable[_A], second: Callable[[], Awaitable[_B]], turns: int
) -> Race[_A, _B]:
    """Start ``first``, let the loop run ``turns`` times (its head start), then start
    ``second()``; wait for both (each within the kit's guard) and return what each gave."""
    started = asyncio.ensure_future(first)
    for _ in range(turns):
        await asyncio.sleep(0)
    rival = asyncio.ensure_future(second())
    early = await _outcome(started)
    late = await _outcome(rival)
    return Race(turns, early, late)


async def _outcome(awaitable: Awaitable[_A]) -> _A | Exception:
    try:
        return await guard(awaitable)
    except Exception as error:
        return error
