"""fold: one pure reading of a log; folding onto a view never changes that view."""

from __future__ import annotations

from loom_runtime import fold

from loom_core import JsonObject, NewEvent, open_storage


async def test_folding_onto_a_view_leaves_that_view_as_it_was() -> None:
    wait: JsonObject = {"position": [0], "call": "sleep", "wake_at": "2026-01-01T00:00:00+00:00"}
    written: list[tuple[str, JsonObject]] = [
        ("EXECUTION_STARTED", {"workflow": "w", "input": [{"n": 1}]}),
        ("EXECUTION_SUSPENDED", {"waits": [wait]}),
        ("EXECUTION_RESUMED",
         {"park": 1, "position": [0], "answer": {"kind": "timer"}, "node": "n"}),
        ("STEP_COMPLETED", {"position": [1], "call": "step", "name": "s", "result": 2}),
        ("EXECUTION_COMPLETED", {"result": 2}),
    ]
    async with open_storage("memory://") as storage:
        events = storage.events
        for sequence, (kind, payload) in enumerate(written):
            await events.append("e", [NewEvent(kind, payload)], expected_sequence=sequence)
        log = await events.read("e")
    parked = fold(log[:2])
    done = fold(log[2:], into=parked)
    assert (done.status, done.result, done.head) == ("completed", 2, 5)
    assert sorted(done.records) == [(0,), (1,)]
    assert (parked.status, parked.head, parked.park is not None) == ("suspended", 2, True)
    assert parked.records == {}
    assert list(parked.waits) == [(0,)]
    assert parked.input == [{"n": 1}]
    done.input.append("more")
    assert parked.input == [{"n": 1}]
