"""The in-memory event store keeps what it was given as checked bytes: nothing a caller
holds (its input, what an append returned, what a read returned, a checked batch) can
change what the store holds."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import re
import subprocess
import sys
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest

from loom_core import (
    Event,
    InvalidEventError,
    InvalidExecutionIdError,
    InvalidSequenceError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
)
from loom_core.memory import MemoryEventStore
from loom_core.spi import AppendRequest, check_batch, check_events


async def test_changing_the_input_after_an_append_changes_nothing_stored() -> None:
    store = MemoryEventStore()
    payload: dict[str, Any] = {"items": [1, 2], "deep": {"n": 1}}
    metadata: dict[str, Any] = {"tags": ["a"]}
    events = [NewEvent("k", payload, metadata)]
    await store.append("e", events, expected_sequence=0)
    payload["items"].append(3)
    payload["deep"]["n"] = 2
    metadata["tags"].append("b")
    events.append(NewEvent("late"))
    (read,) = await store.read("e")
    assert read.payload == {"items": [1, 2], "deep": {"n": 1}}
    assert read.metadata == {"tags": ["a"]}


async def test_changing_what_an_append_or_a_read_returned_changes_nothing_stored() -> None:
    store = MemoryEventStore()
    await store.acquire_fence("e")
    (written,) = await store.append(
        "e", [NewEvent("k", {"items": [1]}, {"m": 1})], expected_sequence=0, fence=1
    )
    assert written.metadata == {"m": 1, "fence": 1}
    returned: Any = written.payload
    returned["items"].append("w")
    written.metadata["m"] = "w"
    written.metadata["fence"] = 99
    (first,) = await store.read("e")
    read: Any = first.payload
    read["items"].append("r")
    first.metadata.clear()
    (again,) = await store.read("e")
    assert again.payload == {"items": [1]}
    assert again.metadata == {"m": 1, "fence": 1}
    assert again.fence == 1
    assert again is not first
    assert again.payload is not first.payload


async def test_one_checked_batch_appended_to_two_stores_keeps_them_apart() -> None:
    batch = check_batch([NewEvent("k", {"items": [1]})])
    one, two = MemoryEventStore(), MemoryEventStore()
    (a,) = await one.append("e", batch, expected_sequence=0)
    (b,) = await two.append("e", batch, expected_sequence=0, fence=0)
    returned: Any = a.payload
    returned["items"].append("one")
    assert (await two.read("e"))[0].payload == {"items": [1]}
    assert (await one.read("e"))[0].metadata == {}
    assert b.metadata == {"fence": 0}


async def test_append_many_results_are_copies_too() -> None:
    store = MemoryEventStore()
    payload: dict[str, Any] = {"n": [1]}
    written = await store.append_many([
        AppendRequest("a", [NewEvent("k", payload)], 0),
        AppendRequest("b", check_batch([NewEvent("k", payload)]), 0, fence=0),
    ])
    payload["n"].append(2)
    returned: Any = written[0][0].payload
    returned["n"].append(3)
    assert (await store.read("a"))[0].payload == {"n": [1]}
    assert (await store.read("b"))[0].payload == {"n": [1]}
    assert written[1][0].metadata == {"fence": 0}


async def test_reads_across_truncation_and_copies_keep_sequences() -> None:
    store = MemoryEventStore()
    await store.append("e", [NewEvent(f"k{i}", i) for i in range(5)], expected_sequence=0)
    assert await store.truncate_prefix_keeping("e", keep_from_sequence=2) == 2
    assert [e.sequence for e in await store.read("e")] == [2, 3, 4]
    assert [e.payload for e in await store.read("e", from_sequence=3, to_sequence=3)] == [3]
    assert await store.copy_prefix("e", "f", through_sequence=3) == 2
    assert [e.sequence for e in await store.read("f")] == [2, 3]
    assert await store.head("f") == 4
    await store.append("f", [NewEvent("k4", "new")], expected_sequence=4)
    assert [e.payload for e in await store.read("f")] == [2, 3, "new"]
    assert [e.payload for e in await store.read("e")] == [2, 3, 4]


class Kind(str):
    pass


@pytest.mark.parametrize(
    "event",
    [
        NewEvent(""),
        NewEvent("bad\nkind"),
        NewEvent("k" * 201),
        NewEvent(Kind("k")),
        NewEvent(7),  # type: ignore[arg-type]
        NewEvent("k", None, {"fence": 1}),
        NewEvent("k", None, {"m": float("nan")}),
        NewEvent("k", None, ["x"]),  # type: ignore[arg-type]
        NewEvent("k", float("inf")),
        ("k", None),
    ],
    ids=["empty-kind", "control-kind", "long-kind", "kind-subclass", "int-kind", "fence-key",
         "nan-metadata", "list-metadata", "inf-payload", "not-a-new-event"],
)
async def test_a_one_event_append_refuses_or_accepts_as_the_batch_check_does(
    event: object,
) -> None:
    store = MemoryEventStore()
    try:
        (expected,) = check_events([event])
    except InvalidEventError as refused:
        with pytest.raises(InvalidEventError, match=re.escape(str(refused))):
            await store.append("e", [event], expected_sequence=0)  # type: ignore[list-item]
        assert await store.head("e") == 0
        return
    (written,) = await store.append("e", [event], expected_sequence=0)  # type: ignore[list-item]
    assert (written.kind, written.payload, written.metadata) == (
        expected.kind, expected.payload, dict(expected.metadata)
    )


async def test_the_first_bad_argument_of_an_append_is_the_one_refused() -> None:
    store = MemoryEventStore()
    bad_event = [NewEvent("k", float("nan"))]
    with pytest.raises(InvalidExecutionIdError):
        await store.append("", bad_event, expected_sequence=-1)
    with pytest.raises(InvalidEventError):
        await store.append("e", bad_event, expected_sequence=-1)
    with pytest.raises(InvalidSequenceError, match="expected_sequence"):
        await store.append("e", [NewEvent("k")], expected_sequence=True, fence=-1)
    with pytest.raises(InvalidSequenceError, match="fence"):
        await store.append("e", [NewEvent("k")], expected_sequence=0, fence=-1)
    await store.append("e", [NewEvent("k")], expected_sequence=0)
    with pytest.raises(SequenceConflictError):
        await store.append("e", [NewEvent("k")], expected_sequence=2)
    await store.acquire_fence("e")
    with pytest.raises(StaleFenceError):
        await store.append("e", [NewEvent("k")], expected_sequence=1, fence=0)
    assert [e.sequence for e in await store.read("e")] == [0]


async def test_an_event_a_store_returns_is_a_frozen_event() -> None:
    store = MemoryEventStore()
    (written,) = await store.append("e", [NewEvent("k", {"a": 1})], expected_sequence=0)
    assert type(written) is Event
    with pytest.raises(dataclasses.FrozenInstanceError):
        written.sequence = 5  # type: ignore[misc]
    assert written == Event("e", 0, "k", {"a": 1}, {}, written.recorded_at)
    assert hash(written.kind) == hash("k")


async def test_a_log_costs_the_garbage_collector_two_objects_however_long() -> None:
    # Every full collection examines each tracked object the store holds, for as long as
    # it holds it: a log is its own object and one list of untracked entries (with a
    # list per field it was seven), whatever it holds and however it was written.
    store = MemoryEventStore()
    await store.acquire_fence("warm-up")
    await store.append("warm-up", [NewEvent("k")], expected_sequence=0)
    executions = 200
    gc.collect()
    before = len(gc.get_objects())
    for index in range(executions):
        execution_id = f"e-{index}"
        await store.append(
            execution_id,
            [NewEvent("k", {"items": [index], "deep": {"n": index}}, {"m": [1]})],
            expected_sequence=0,
        )
        await store.append(
            execution_id, [NewEvent("k"), NewEvent("k", {"x": 1})], expected_sequence=1
        )
        await store.append_many(
            [AppendRequest(execution_id, [NewEvent("k")], expected_sequence=3)]
        )
    gc.collect()
    added = len(gc.get_objects()) - before
    assert added <= 2 * executions + 20
    assert len(await store.read("e-7")) == 4


async def test_a_subscription_given_up_on_a_finished_log_leaves_nothing_behind() -> None:
    # A follower (a dashboard, a tail) that stops waiting on a log never written again,
    # a finished execution's, kept the store's wake-up signal for that log for as long as
    # the store lived: one per execution ever followed, in a process that runs for months.
    store = MemoryEventStore()
    executions = 200
    for index in range(executions):
        await store.append(f"e-{index}", [NewEvent("k")], expected_sequence=0)

    def signals() -> int:
        gc.collect()
        return sum(isinstance(o, asyncio.Event) for o in gc.get_objects())

    before = signals()
    for index in range(executions):
        follower = cast(AsyncGenerator[Event, None], store.subscribe(f"e-{index}"))
        assert (await follower.__anext__()).sequence == 0
        waiting = follower.__anext__()
        waiting.send(None)  # runs to its wait for the log's next event
        with pytest.raises(asyncio.CancelledError):
            waiting.throw(asyncio.CancelledError())  # its caller gives up, as on a timeout
    assert signals() == before

    # A follower still waiting is woken by the next append, as before.
    live = cast(AsyncGenerator[Event, None], store.subscribe("e-0", from_sequence=1))
    nxt = asyncio.ensure_future(live.__anext__())
    await store.append("e-0", [NewEvent("k")], expected_sequence=1)
    assert (await nxt).sequence == 1
    await live.aclose()


_HELD_PER_EVENT = """
import asyncio, os
from loom_core import NewEvent
from loom_core.memory import MemoryEventStore

def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

async def main() -> None:
    store = MemoryEventStore()
    payload = {"step": "one", "result": {"ok": True}}
    for i in range(200):
        await store.append("warm-up", [NewEvent("k", payload)], expected_sequence=i)
    before = resident()
    for i in range(20_000):
        await store.append("one", [NewEvent("k", payload)], expected_sequence=i)
        batch = [NewEvent("k", payload), NewEvent("k", {"n": i}, {"m": "v"})]
        await store.append("two", batch, expected_sequence=2 * i)
    print((resident() - before) / 60_000)

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_small_event_held_costs_the_process_a_few_hundred_bytes() -> None:
    # orjson returns its text in an object that keeps the whole buffer it wrote into (a
    # kilobyte or four, however short the text): a log keeping those objects grew the
    # process by 1.5 to 5.6 KB per small event, where the event itself is under 300 bytes.
    # A fresh interpreter, so that no heap freed by other tests absorbs the growth.
    done = subprocess.run(
        [sys.executable, "-c", _HELD_PER_EVENT],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    per_event = float(done.stdout)
    assert per_event < 1_000, f"{per_event:.0f} bytes of resident memory per event held"
