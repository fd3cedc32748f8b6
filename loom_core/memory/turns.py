"""How often the in-memory stores let other tasks run (docs/design.md, "When the
in-memory stores let other tasks run").

A call of an in-memory store waits on nothing, so the store decides when other tasks run:
one call in ``YIELD_EVERY`` of each store instance, its first call among them, yields to
the event loop once before doing its work, so a task calling a store in a loop lets every
other ready task run at least that often. Which call yields depends only on how many came
before it, so the interleaving is the same on every run. Each call is one synchronous step
after that point: tasks interleave between calls and never inside one.
"""

from __future__ import annotations

import types
from collections.abc import Generator
from typing import Final

__all__ = ["YIELD_EVERY", "one_turn"]

YIELD_EVERY: Final = 16


@types.coroutine
def one_turn() -> Generator[None, None, None]:
    """``await asyncio.sleep(0)`` without the coroutine around it: the loop runs every
    other ready task once, then resumes the caller."""
    yield
