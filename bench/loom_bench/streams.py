"""The stream rows: event-store writes with nothing of a workflow around them, and ours.

Each row is one write a plain event store makes, measured on our side through
``open_storage`` and the SPI and, beside it, by eventsourcing's recorders
(:mod:`loom_bench.eventsourcing_peer`) writing the same events:

- ``stream-new``: a new stream of three events in one atomic write
  (``events.append(id, [start, step, complete], expected_sequence=0)``);
- ``stream-append``: one event appended at the next position of a stream of three, which
  an untimed setup wrote before the clock started (``expected_sequence=3``).

Both sides write the same kinds with the same JSON payloads (the ones of the ``short`` row),
one stream per execution id, and both refuse a write at a position already taken: ours by
``expected_sequence``, eventsourcing's by its primary key on (originator, version).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from loom_bench.backends import Backend
from loom_bench.drive import RunPlan, Tick, drive_concurrently
from loom_bench.scenarios import COMPLETE, START, STEP, EventTemplate
from loom_bench.statistics import Sample
from loom_core import EventStore, NewEvent, open_storage
from loom_core.spi import PluginHost

__all__ = [
    "STREAMS",
    "StreamScenario",
    "measure_loom_stream",
    "stream_scenario",
    "write_stream",
    "write_stream_setup",
]


@dataclass(frozen=True, slots=True)
class StreamScenario:
    """One stream row: ``setup`` written untimed, then ``events`` in one timed write."""

    key: str
    title: str
    events: tuple[EventTemplate, ...]
    setup: tuple[EventTemplate, ...] = ()

    @property
    def position(self) -> int:
        """Where the timed write starts: our ``expected_sequence`` (eventsourcing's
        first ``originator_version`` is one more: its versions count from 1)."""
        return len(self.setup)


STREAMS: Final[Mapping[str, StreamScenario]] = {
    s.key: s
    for s in (
        StreamScenario(
            "stream-new", "new stream of three events, one atomic write", (START, STEP, COMPLETE)
        ),
        StreamScenario(
            "stream-append", "one event appended to a stream of three", (STEP,),
            setup=(START, STEP, COMPLETE),
        ),
    )
}
"""Every stream row."""


def stream_scenario(key: str) -> StreamScenario | None:
    return STREAMS.get(key)


def _batch(templates: tuple[EventTemplate, ...]) -> tuple[NewEvent, ...]:
    return tuple(NewEvent(t.kind, t.payload) for t in templates)


# Built once per row: a NewEvent is immutable, and the stores copy what they keep.
_BATCHES: Final[dict[str, tuple[tuple[NewEvent, ...], tuple[NewEvent, ...]]]] = {
    s.key: (_batch(s.setup), _batch(s.events)) for s in STREAMS.values()
}


def _batches(scenario: StreamScenario) -> tuple[tuple[NewEvent, ...], tuple[NewEvent, ...]]:
    cached = _BATCHES.get(scenario.key)
    if cached is not None and STREAMS.get(scenario.key) is scenario:
        return cached
    return _batch(scenario.setup), _batch(scenario.events)


async def write_stream_setup(events: EventStore, stream: str, scenario: StreamScenario) -> None:
    """The untimed part: the stream the timed write appends to (nothing for a new one)."""
    setup, _ = _batches(scenario)
    if setup:
        await events.append(stream, setup, expected_sequence=0)


async def write_stream(events: EventStore, stream: str, scenario: StreamScenario) -> None:
    """The timed write: every event of the row in one append at the stream's next position."""
    _, batch = _batches(scenario)
    await events.append(stream, batch, expected_sequence=scenario.position)


async def measure_loom_stream(
    backend: Backend,
    scenario: StreamScenario,
    plan: RunPlan,
    tag: str,
    tick: Tick,
    plugins: PluginHost,
) -> Sample:
    """One timed run of ``scenario`` on a fresh storage of ``backend``: ``plan.concurrency``
    asyncio tasks, after the warm-up and (for an append) the streams' untimed setup."""
    async with open_storage(
        backend.storage_url(tag), options=backend.options, plugins=plugins
    ) as storage:
        events = storage.events

        async def warm(index: int) -> None:
            await write_stream_setup(events, plan.warmup_id(index), scenario)
            await write_stream(events, plan.warmup_id(index), scenario)

        async def set_up(index: int) -> None:
            await write_stream_setup(events, plan.execution_id(index), scenario)

        async def timed(index: int) -> None:
            await write_stream(events, plan.execution_id(index), scenario)

        if plan.warmup:
            await drive_concurrently(plan.warmup, plan.concurrency, warm)
        if scenario.setup:
            await drive_concurrently(plan.executions, plan.concurrency, set_up)
        return await drive_concurrently(plan.executions, plan.concurrency, timed, tick)
