"""fold: one pure reading of a log; folding onto a view never changes that view."""

from __future__ import annotations

import contextvars

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


async def test_a_started_run_sees_exactly_what_fold_makes_of_its_first_event() -> None:
    # app.start builds the first run's view itself rather than folding the event it just
    # wrote; the two must never drift apart.
    from loom_runtime import Context, Loom
    from loom_runtime.driver import Run

    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n-1", recover=False, timers=False)

        @app.workflow(name="waits")
        async def waits(ctx: Context, order: str, count: int) -> None:
            await ctx.receive("never")

        async with app:
            seen: list[object] = []
            original = app._spawn

            def spy(run: Run, context: contextvars.Context | None = None) -> None:
                seen.append(fold([], into=run._view))
                original(run, context)

            app._spawn = spy  # type: ignore[method-assign]
            await app.start(waits, "o-1", 3, id="e-1")
            await app.drain()
            log = await storage.events.read("e-1")
            assert seen == [fold(log[:1])]


def test_folding_nothing_onto_a_view_copies_every_field() -> None:
    # The copy is written out field by field (it is on every resume's path): a field added
    # to View and not to the copy fails here.
    from dataclasses import fields
    from datetime import UTC, datetime

    from loom_runtime.fold import Park, Recorded, View
    from loom_runtime.records import Wait

    moment = datetime(2026, 1, 1, tzinfo=UTC)
    wait = Wait((1,), "sleep", moment)
    view = View(
        "e", head=7, status="suspended", workflow="w", input=[1], fingerprint="f",
        node="n", root="r", generation=2, continued_from="c", parent={"p": 1}, fence=3,
        records={(0,): Recorded((0,), "step", "s")}, waits={(1,): wait},
        park=Park(6, 3, (wait,)), consumed={4}, result=5, error=("T", "m"),
        cancel_reason="x", successor="s", started_at=moment, finished_at=moment,
        deadline=moment, timed_out=True, forked_from="o", forked_at=4, recoveries=2,
        recovered_by="fp", driven_by="fd", carried_on=1,
        retries={(2,): Recorded((2,), "step", "r")}, parked_last=6,
    )
    defaults = View("e")
    assert all(getattr(view, f.name) != getattr(defaults, f.name) for f in fields(View)
               if f.name != "execution_id")
    copy = fold([], into=view)
    assert copy == view
    for name in ("input", "records", "waits", "consumed", "retries"):
        assert getattr(copy, name) is not getattr(view, name)


async def test_a_forks_edge_and_copied_topics_are_read_and_malformed_ones_refused() -> None:
    import pytest
    from loom_runtime import LogFormatError

    started: JsonObject = {"workflow": "w", "input": [], "forked_from": {"execution": "o",
                                                                         "at": 2}}
    taken: JsonObject = {"position": [0], "call": "receive_any", "name": "b", "result": 1,
                         "topics": ["a", "b"]}
    async with open_storage("memory://") as storage:
        events = storage.events
        await events.append("e", [NewEvent("EXECUTION_STARTED", started),
                                  NewEvent("STEP_COMPLETED", taken)], expected_sequence=0)
        view = fold(await events.read("e"))
        assert (view.forked_from, view.forked_at) == ("o", 2)
        assert view.records[(0,)].topics == ("a", "b")
        malformed: list[tuple[JsonObject, JsonObject]] = [
            ({**started, "forked_from": {"execution": "o"}}, taken),
            ({**started, "forked_from": "o"}, taken),
            (started, {**taken, "topics": "a"}),
            (started, {**taken, "topics": ["a", 2]}),
        ]
        for bad_start, bad_step in malformed:
            await events.append("bad", [NewEvent("EXECUTION_STARTED", bad_start),
                                        NewEvent("STEP_COMPLETED", bad_step)],
                                expected_sequence=0)
            with pytest.raises(LogFormatError):
                fold(await events.read("bad"))
            await events.delete_execution("bad")


async def test_carry_ons_end_a_count_of_recoveries_and_count_on_their_own() -> None:
    """A takeover by a live process of its own run (``carried_on``) is not a death: it
    ends the count of recoveries in a row and starts one of carry-ons, which any write of
    the run, or a node's recovery, ends in turn."""
    from loom_runtime import records

    async with open_storage("memory://") as storage:
        events = storage.events
        batches: list[list[NewEvent]] = [
            [records.started("w", [], fingerprint="fp", node="n", root="e", generation=0)],
            [records.recovered("n", 1, "fp")],
            [records.recovered("n", 2, "fp")],
            [records.recovered("n", 3, "fp", carried_on=True)],
            [records.recovered("n", 4, "fp", carried_on=True)],
        ]
        for sequence, batch in enumerate(batches):
            await events.append("e", batch, expected_sequence=sequence)
        log = await events.read("e")
        assert [(v.recoveries, v.carried_on) for v in (fold(log[:n]) for n in range(2, 6))] == [
            (1, 0), (2, 0), (0, 1), (0, 2)
        ]
        await events.append("e", [records.recovered("n", 5, "fp")], expected_sequence=5)
        after = fold(await events.read("e"))
        assert (after.recoveries, after.carried_on) == (1, 0)
        await events.append(
            "e", [records.recovered("n", 6, "fp", carried_on=True)], expected_sequence=6
        )
        await events.append("e", [records.completed({"ok": True})], expected_sequence=7)
        ended = fold(await events.read("e"))
        assert (ended.recoveries, ended.carried_on) == (0, 0)
