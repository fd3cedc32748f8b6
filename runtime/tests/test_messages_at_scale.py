"""Messages at scale: what a send and a receive cost does not grow with the messages an
inbox holds. The store's work is counted by a probe (reads, and the events they return),
the runtime's own by the lines of its code that run; nothing is timed."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import loom_runtime
import pytest
from loom_runtime import Context
from loom_runtime.inbox import Message
from loom_runtime.records import inbox_of
from store_probes import Wired, wired

_RUNTIME = str(Path(loom_runtime.__file__).parent) + os.sep

_Tracer = Callable[[FrameType, str, Any], Any]


class RuntimeLines:
    """Counts the lines of the runtime's own code run while it is entered (in this thread:
    the event loop's), a measure of its work that, unlike a duration, a test can bound."""

    def __init__(self) -> None:
        self.count = 0
        self._before = sys.gettrace()

    def _line(self, frame: FrameType, event: str, arg: Any) -> _Tracer:
        if event == "line":
            self.count += 1
        return self._line

    def _call(self, frame: FrameType, event: str, arg: Any) -> _Tracer | None:
        return self._line if frame.f_code.co_filename.startswith(_RUNTIME) else None

    def __enter__(self) -> RuntimeLines:
        self._before = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sys.settrace(self._before)


@dataclass(frozen=True, slots=True)
class Work:
    """What ``n`` messages cost, sent and received: lines of the runtime run, and the
    reads of the receiver's inbox and log with the events they returned."""

    n: int
    lines: int
    inbox_reads: int
    inbox_events: int
    log_reads: int
    log_events: int

    def per_message(self) -> dict[str, float]:
        return {
            "lines": self.lines / self.n,
            "inbox reads": self.inbox_reads / self.n,
            "inbox events": self.inbox_events / self.n,
            "log reads": self.log_reads / self.n,
            "log events": self.log_events / self.n,
        }


TOPICS = ("a", "b", "c", "d")


def register(w: Wired, gate: asyncio.Event) -> None:
    async def wait_gate() -> None:
        await gate.wait()

    async def take(ctx: Context, n: int, how: str, gated: bool) -> int:
        """Receive ``n`` messages: on "a", on any of TOPICS, or (topics) all of "d",
        then of "c", ..., so the messages on the others wait behind."""
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

    w.app.workflow(name="take")(take)


async def send_all(w: Wired, how: str, n: int) -> None:
    """Send the ``n`` messages ``take`` receives; with keys, each key is sent again, and an
    older one too, none of which stores anything."""
    for i in range(n):
        if how == "keys":
            for key in (f"k{i}", f"k{i}", f"k{i // 2}"):
                await w.app.send("r", "a", i, key=key)
        elif how in ("any", "topics"):
            await w.app.send("r", TOPICS[i % len(TOPICS)], i)
        else:
            await w.app.send("r", "a", i)


async def measure(url: str, how: str, n: int, *, parked: bool) -> Work:
    """Send ``n`` messages to a receiver that is running (held in a step until they are
    all sent) or parked on its first receive, and have it receive them all."""
    async with wired(url) as w:
        gate = asyncio.Event()
        register(w, gate)
        handle = await w.app.start("take", n, how, not parked, id="r")
        if parked:
            await w.app.drain()
        inbox = inbox_of("r")
        inbox_reads, inbox_events = w.probe.reads[inbox], w.probe.events_read[inbox]
        log_reads, log_events = w.probe.reads["r"], w.probe.events_read["r"]
        with RuntimeLines() as lines:
            await send_all(w, how, n)
            gate.set()
            assert await handle.result(timeout=60) == n
        return Work(
            n,
            lines.count,
            w.probe.reads[inbox] - inbox_reads,
            w.probe.events_read[inbox] - inbox_events,
            w.probe.reads["r"] - log_reads,
            w.probe.events_read["r"] - log_events,
        )


SENDS = {"keys": 3}  # sends per message received; one unless said here


@pytest.mark.parametrize("how", ["one topic", "keys", "topics", "any"])
async def test_a_running_receiver_and_its_senders_do_the_same_work_per_message_at_any_count(
    how: str,
) -> None:
    """Each send stores its message after reading what was appended since the last read,
    finds a key among those sent and an instant no message names in one look each (the
    virtual clock gives every send the same), and each receive takes the oldest message
    on its topics without passing again those it consumed, nor those of other topics."""
    small = (await measure("memory://", how, 100, parked=False)).per_message()
    large = (await measure("memory://", how, 400, parked=False)).per_message()
    assert large["lines"] <= small["lines"] * 1.1, (small, large)
    sends = SENDS.get(how, 1)
    for work in (small, large):
        assert work["inbox reads"] <= sends + 1, work  # one by each send, one by each receive
        assert work["inbox events"] <= 2 * sends + 1, work
        assert work["log reads"] <= 2 * sends, work
        assert work["log events"] <= 2 * sends, work


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@pytest.mark.parametrize("how", ["one topic", "keys", "topics", "any"])
async def test_each_send_to_a_parked_receiver_reads_a_bounded_tail_of_its_inbox_and_log(
    tmp_path: Path, backend: str, how: str
) -> None:
    """A send's store and delivery, and the resumed run's receives, each read what was
    appended since; a receive beside a send (the resumed run's, while the next send is
    stored) reads a tail too, not the inbox whole. The replay of a resumed run grows with
    what it received, the store reads do not."""
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"
    work = (await measure(url, how, 300, parked=True)).per_message()
    sends = SENDS.get(how, 1)
    # SQLite's answers come from a thread: a resumed run and the next send interleave
    # there as they do not over memory, and each reads a tail of its own.
    assert work["inbox reads"] <= 6 * sends, work
    assert work["inbox events"] <= 8 * sends, work
    assert work["log reads"] <= 4 * sends, work
    assert work["log events"] <= 12 * sends, work


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_send_beside_a_receive_reading_the_inbox_reads_only_what_was_appended(
    tmp_path: Path, backend: str
) -> None:
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"
    async with wired(url) as w:
        gate = asyncio.Event()
        register(w, gate)
        handle = await w.app.start("take", 60, "one topic", True, id="r")
        for i in range(50):
            await w.app.send("r", "a", i)
        inbox = inbox_of("r")
        held, release = asyncio.Event(), asyncio.Event()

        async def hold(execution_id: str) -> None:
            if execution_id == inbox and not held.is_set():
                held.set()
                await release.wait()

        w.probe.before_read = hold
        gate.set()  # the receiver's first receive reads the inbox: held there
        await held.wait()
        before = w.probe.events_read[inbox]
        for i in range(50, 60):
            await w.app.send("r", "a", i)
        read = w.probe.events_read[inbox] - before
        release.set()
        assert await handle.result(timeout=10) == 60
        assert read <= 2 * 10  # the last message known, and the one before this send's
        assert [m.value for m in await w.app.inbox.messages("r")] == list(range(60))


async def test_an_execution_that_received_ten_thousand_messages_leaves_none_held() -> None:
    def messages_held() -> int:
        gc.collect()
        return sum(isinstance(o, Message) for o in gc.get_objects())

    async with wired() as w:
        gate = asyncio.Event()
        register(w, gate)
        handle = await w.app.start("take", 10_000, "one topic", True, id="r")
        for i in range(10_000):
            await w.app.send("r", "a", i)
        assert messages_held() > 9_000  # read by the sends, for the receiver to take
        gate.set()
        assert await handle.result(timeout=60) == 10_000
        await w.app.drain()
        assert messages_held() == 0
