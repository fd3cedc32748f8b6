"""Shared fixtures: an app on ``memory://`` with a virtual clock and a seeded random."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
from loom_runtime import Loom
from loom_runtime.testing import VirtualClock


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def app(clock: VirtualClock) -> AsyncIterator[Loom]:
    errors: list[BaseException] = []
    loom = Loom("memory://", node="test-node", clock=clock, random=random.Random(7),
                on_error=errors.append)
    async with loom:
        loom.reported = errors  # type: ignore[attr-defined]
        yield loom
