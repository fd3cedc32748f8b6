"""What N messages cost an execution: store reads, the events they return, and CPU time.

For each scenario, N messages are sent to one execution with ``app.send``, one after
another, and it receives them all with ``ctx.receive`` (or ``ctx.receive_any``):

- ``parked``: the receiver is parked on its first receive; each send delivers (a resume
  and a replay of the body) and the body parks again;
- ``running``: the receiver is held in a step while every message is sent, then receives
  them all without parking;
- ``keys``: as ``parked``, each message sent with a key of its own, then sent again with
  that key and with an older one (three sends a message, one stored);
- ``topics``: as ``running``, over four topics in turn; the receiver takes every message
  of the last topic first, so those of the others wait behind;
- ``any-parked``: as ``parked``, over four topics in turn, received with ``receive_any``.

The event store is wrapped to count its reads (of the inbox stream ``$inbox:<id>`` and of
the execution's log apart) and the events they return. Printed: one Markdown row per
scenario, count and backend.

    python3 bench/messages_at_scale.py --counts 100,1000,5000 --backends memory,sqlite

No figure here is a test: it is measured and printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from loom_runtime import Context, Loom

from loom_core import Event, EventStore, NewEvent, Storage, open_storage
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator

SCENARIOS = ("parked", "running", "keys", "topics", "any-parked")
TOPICS = ("a", "b", "c", "d")


class CountingEventStore(EventStoreDecorator):
    """Forwards everything; counts reads and the events they return, inbox and log apart."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        got = await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )
        stream = "inbox" if execution_id.startswith("$inbox:") else "log"
        self.counts[f"{stream} reads"] += 1
        self.counts[f"{stream} events"] += len(got)
        return got

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        self.counts["appends"] += 1
        return await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=FORWARD,
        append_many=FORWARD,
        delete_execution=FORWARD,
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=FORWARD,
    )


async def measure(url: str, scenario: str, n: int) -> tuple[Counter[str], float]:
    """The store's counts and the process's CPU seconds for one scenario."""
    base = await open_storage(url)
    counting = CountingEventStore(base.events)
    storage = Storage(counting, base.timers, base.leases, url=base.url, on_close=base.close)
    app = Loom(storage, node="bench", timers=False, recover=False)
    gate = asyncio.Event()

    async def wait_gate() -> None:
        await gate.wait()

    @app.workflow()
    async def receiver(ctx: Context, n: int, gated: bool, how: str) -> int:
        if gated:
            await ctx.step(wait_gate)
        if how == "any":
            for _ in range(n):
                await ctx.receive_any(*TOPICS)
        elif how == "topics":
            for topic in reversed(TOPICS):
                for _ in range(n // len(TOPICS)):
                    await ctx.receive(topic)
        else:
            for _ in range(n):
                await ctx.receive("a")
        return n

    parked = scenario in ("parked", "keys", "any-parked")
    how = {"topics": "topics", "any-parked": "any"}.get(scenario, "one")
    started = time.process_time()
    try:
        async with app:
            handle = await app.start(receiver, n, not parked, how, id="r")
            if parked:
                await app.drain()
            for i in range(n):
                if scenario == "keys":
                    for key in (f"k{i}", f"k{i}", f"k{i // 2}"):
                        await app.send("r", "a", i, key=key)
                elif how in ("topics", "any"):
                    await app.send("r", TOPICS[i % len(TOPICS)], i)
                else:
                    await app.send("r", "a", i)
            gate.set()
            if await handle.result(timeout=3600) != n:
                raise AssertionError(f"{scenario}: the receiver did not take {n} messages")
    finally:
        await storage.close()
    return counting.counts, time.process_time() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="100,1000,5000", help="messages per run")
    parser.add_argument("--backends", default="memory,sqlite", help="memory, sqlite")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=", ".join(SCENARIOS))
    args = parser.parse_args()
    print(
        "| scenario | N | backend | inbox reads | inbox events | log reads | log events "
        "| appends | CPU s |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            for n in (int(c) for c in args.counts.split(",")):
                for scenario in args.scenarios.split(","):
                    if backend == "sqlite":
                        url = f"sqlite:///{Path(tmp) / f'{scenario}-{n}.db'}"
                    else:
                        url = "memory://"
                    counts, cpu = await measure(url, scenario, n)
                    print(
                        f"| {scenario} | {n} | {backend} | {counts['inbox reads']} "
                        f"| {counts['inbox events']} | {counts['log reads']} "
                        f"| {counts['log events']} | {counts['appends']} | {cpu:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    asyncio.run(main())
