"""The optional methods other than fencing: ``append_many``, ``delete_execution``,
``copy_prefix``, ``truncate_prefix_keeping`` and ``subscribe``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any, Final

import pytest

from loom_conformance.requirements import requires
from loom_conformance.suites._races import MAX_TURNS, race_after_turns
from loom_conformance.suites._support import (
    GUARD_SECONDS,
    SAME_VALUES,
    app,
    assert_the_same_values,
    bump_token,
    close_iterator,
    guard,
    kernel,
    nested,
    scribble,
    snapshot,
    token_of,
)
from loom_core import (
    AppendRequest,
    Event,
    EventKind,
    EventStore,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    InvalidEventError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidSequenceError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    Storage,
    StoreClosedError,
)

__all__ = ["EventStoreOptionalContract"]

SETTLE_SECONDS: Final = 0.2
"""How long a subscription is left to reach its wait before the store is closed under it.
Nothing a caller sees says that it waits; a correct store passes whether or not it got
there, so this is never an assertion about speed, only the chance to catch one that hangs."""


class EventStoreOptionalContract:
    """Batch writes, deletion, branching, compaction and live reads."""

    # -- append_many --------------------------------------------------------------------

    @requires.append_many
    async def test_append_many_writes_every_request_and_returns_them_in_order(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-b", [app()], expected_sequence=0)
        results = await loom_events.append_many(
            [
                AppendRequest("exec-a", [app(payload=1), app(payload=2)], 0),
                AppendRequest("exec-b", [kernel(EventKind.STEP_COMPLETED)], 1, fence=0),
            ]
        )
        assert [[(e.execution_id, e.sequence) for e in r] for r in results] == [
            [("exec-a", 0), ("exec-a", 1)],
            [("exec-b", 1)],
        ]
        assert results[1][0].metadata == {"fence": 0}
        assert "fence" not in results[0][0].metadata
        assert await loom_events.read("exec-a") == results[0]
        assert (await loom_events.read("exec-b"))[1:] == results[1]

    @requires.append_many
    async def test_append_many_payloads_read_back_with_their_types_and_key_order(
        self, loom_events: EventStore
    ) -> None:
        (written,) = await loom_events.append_many(
            [AppendRequest("exec-types", [NewEvent("k", p) for p in SAME_VALUES], 0)]
        )
        assert_the_same_values("append_many", written)
        assert_the_same_values("read after append_many", await loom_events.read("exec-types"))

    @requires.append_many
    async def test_append_many_results_are_copies_the_caller_cannot_corrupt(
        self, loom_events: EventStore
    ) -> None:
        # One execution per call: a store may refuse a batch that spans its partitions.
        results = [
            *await loom_events.append_many(
                [AppendRequest("exec-a", [nested(n=0), nested(n=1)], 0)]
            ),
            *await loom_events.append_many([AppendRequest("exec-a", [nested(n=2)], 2, fence=0)]),
        ]
        kept = await loom_events.read("exec-a")
        for written in results:
            scribble(written)

        assert await loom_events.read("exec-a") == kept, (
            "changing the events append_many returned changed what read returns: it must "
            "return copies, not the objects the store keeps"
        )

    @requires.append_many
    async def test_append_many_with_one_conflicting_request_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-b", [app(), app()], expected_sequence=0)
        before = await snapshot(loom_events, "exec-a", "exec-c")
        with pytest.raises(SequenceConflictError) as caught:
            await loom_events.append_many(
                [
                    AppendRequest("exec-a", [app()], 0),
                    AppendRequest("exec-b", [app()], 1),
                    AppendRequest("exec-c", [app()], 0),
                ]
            )
        assert caught.value.execution_id == "exec-b"
        assert caught.value.actual_head == 2
        with pytest.raises(ExecutionAlreadyExistsError):
            await loom_events.append_many(
                [AppendRequest("exec-a", [app()], 0), AppendRequest("exec-b", [app()], 0)]
            )
        assert await snapshot(loom_events, "exec-a", "exec-c") == before

    @requires.append_many
    @requires.fencing
    async def test_append_many_with_one_stale_fence_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-b", [app()], expected_sequence=0)
        token = await bump_token(loom_events, "exec-b")
        before = await snapshot(loom_events, "exec-a")
        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append_many(
                [
                    AppendRequest("exec-a", [app()], 0, fence=0),
                    AppendRequest("exec-b", [app()], 1, fence=token - 1),
                ]
            )
        assert caught.value.current_fence == token
        assert await snapshot(loom_events, "exec-a") == before

    @requires.append_many
    @requires.fencing
    async def test_append_many_is_refused_with_its_first_refused_request(
        self, loom_events: EventStore
    ) -> None:
        """Requests are checked in the order given: the first refused one is what the
        caller hears, whatever a later one does wrong."""
        await loom_events.append("exec-a", [app()], expected_sequence=0)
        await loom_events.append("exec-b", [app()], expected_sequence=0)
        token = await bump_token(loom_events, "exec-b")
        before = await snapshot(loom_events, "exec-a")
        stale = AppendRequest("exec-b", [app()], 1, fence=token - 1)
        ahead = AppendRequest("exec-a", [app()], 3)
        with pytest.raises(StaleFenceError) as stale_first:
            await loom_events.append_many([stale, ahead])
        assert stale_first.value.execution_id == "exec-b"
        with pytest.raises(SequenceConflictError) as ahead_first:
            await loom_events.append_many([ahead, stale])
        assert (ahead_first.value.execution_id, ahead_first.value.actual_head) == ("exec-a", 1)
        assert await snapshot(loom_events, "exec-a") == before

    @requires.append_many
    async def test_append_many_with_one_bad_request_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-b", [app()], expected_sequence=0)
        before = await snapshot(loom_events, "exec-a")
        good = AppendRequest("exec-a", [app()], 0)
        bad_batches: list[tuple[type[Exception], list[Any]]] = [
            (InvalidEventError, [good, AppendRequest("exec-b", [NewEvent("k", {1, 2})], 1)]),  # type: ignore[arg-type]
            (
                InvalidEventError,
                [good, AppendRequest("exec-b", [NewEvent("k", None, {"fence": 3})], 1)],
            ),
            (InvalidEventError, [good, AppendRequest("exec-b", [], 1)]),
            (InvalidExecutionIdError, [good, AppendRequest("bad\x00id", [app()], 0)]),
            (InvalidSequenceError, [good, AppendRequest("exec-b", [app()], -1)]),
            (InvalidSequenceError, [good, AppendRequest("exec-b", [app()], 1, fence=-1)]),
            (InvalidInputError, [good, AppendRequest("exec-a", [app()], 1)]),
            (InvalidInputError, [good, "not a request"]),
            (InvalidInputError, []),
        ]
        for error, batch in bad_batches:
            with pytest.raises(error):
                await loom_events.append_many(batch)
        not_a_sequence: Any = good
        with pytest.raises(InvalidInputError):
            await loom_events.append_many(not_a_sequence)
        assert await snapshot(loom_events, "exec-a") == before

    @requires.append_many
    async def test_concurrent_append_many_over_one_execution_has_one_winner(
        self, loom_events: EventStore
    ) -> None:
        results = await guard(
            asyncio.gather(
                *(
                    loom_events.append_many(
                        [AppendRequest("exec-shared", [app()], 0),
                         AppendRequest(f"exec-own-{i}", [app()], 0)]
                    )
                    for i in range(6)
                ),
                return_exceptions=True,
            )
        )
        assert sum(isinstance(r, tuple) for r in results) == 1, results
        winner = next(i for i, r in enumerate(results) if isinstance(r, tuple))
        assert await loom_events.list_executions() == (f"exec-own-{winner}", "exec-shared")

    # -- append_if_unchanged ------------------------------------------------------------

    @requires.append_if_unchanged
    async def test_append_if_unchanged_results_are_copies_the_caller_cannot_corrupt(
        self, loom_events: EventStore
    ) -> None:
        returned = [
            await loom_events.append_if_unchanged(
                "exec-u", [nested(n=0)], expected_sequence=0, observed_fence=0
            ),
            await loom_events.append_if_unchanged(
                "exec-u", [nested(n=1), nested(n=2)], expected_sequence=1, observed_fence=0
            ),
        ]
        kept = await loom_events.read("exec-u")
        for written in returned:
            scribble(written)

        assert await loom_events.read("exec-u") == kept, (
            "changing the events append_if_unchanged returned changed what read returns: "
            "it must return copies, not the objects the store keeps"
        )

    # -- delete_execution ---------------------------------------------------------------

    @requires.delete_execution
    async def test_delete_execution_removes_the_log(self, loom_events: EventStore) -> None:
        await loom_events.append("exec-d", [app(), app()], expected_sequence=0)
        await loom_events.append("exec-keep", [app()], expected_sequence=0)

        assert await loom_events.delete_execution("exec-d") is True
        assert await loom_events.read("exec-d") == ()
        assert await loom_events.head("exec-d") == 0
        assert await loom_events.list_executions() == ("exec-keep",)
        assert await loom_events.delete_execution("exec-d") is False
        assert await loom_events.delete_execution("never-existed") is False
        assert len(await loom_events.read("exec-keep")) == 1

        recreated = await loom_events.append("exec-d", [app("again")], expected_sequence=0)
        assert recreated[0].sequence == 0

    @requires.delete_execution
    @requires.fencing
    async def test_delete_moves_the_token_so_a_zombie_of_a_recreated_id_stays_fenced_out(
        self, loom_events: EventStore
    ) -> None:
        # The zombie wrote under token 0, then a new owner fenced it out.
        await loom_events.append("exec-z", [app()], expected_sequence=0, fence=0)
        token = await bump_token(loom_events, "exec-z")
        assert await loom_events.delete_execution("exec-z") is True
        await loom_events.append("exec-z", [app("recreated")], expected_sequence=0)
        before = await snapshot(loom_events)

        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append("exec-z", [app("zombie")], expected_sequence=1, fence=0)
        assert caught.value.current_fence == token + 1, "the delete moved the token on"
        assert await snapshot(loom_events) == before
        assert await bump_token(loom_events, "exec-z") == token + 2, "the token went on"

    @requires.delete_execution
    @requires.fencing
    @pytest.mark.parametrize("acquired", [False, True], ids=["token-0", "acquired"])
    async def test_delete_fences_out_the_holder_of_the_current_token(
        self, loom_events: EventStore, acquired: bool
    ) -> None:
        # The runner holds the current token (0 for an execution never fenced) and has
        # written two events; the log is deleted and re-created to the same head, so only
        # the token can tell the runner it no longer writes the log it knew.
        held = await bump_token(loom_events, "exec-h") if acquired else 0
        await loom_events.append("exec-h", [app(), app()], expected_sequence=0, fence=held)
        assert await loom_events.delete_execution("exec-h") is True
        await loom_events.append("exec-h", [app("new"), app("new")], expected_sequence=0)
        before = await snapshot(loom_events)

        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append(
                "exec-h", [app("runner")], expected_sequence=2, fence=held
            )
        assert (caught.value.presented_fence, caught.value.current_fence) == (held, held + 1)
        assert await snapshot(loom_events) == before

    @requires.delete_execution
    @requires.append_if_unchanged
    @pytest.mark.parametrize("acquired", [False, True], ids=["token-0", "acquired"])
    async def test_delete_refuses_append_if_unchanged_under_the_token_seen_before_it(
        self, loom_events: EventStore, acquired: bool
    ) -> None:
        held = await bump_token(loom_events, "exec-u") if acquired else 0
        await loom_events.append_if_unchanged(
            "exec-u", [app()], expected_sequence=0, observed_fence=held
        )
        assert await loom_events.delete_execution("exec-u") is True
        await loom_events.append("exec-u", [app("new")], expected_sequence=0)
        before = await snapshot(loom_events)

        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append_if_unchanged(
                "exec-u", [app("runner")], expected_sequence=1, observed_fence=held
            )
        assert caught.value.current_fence == held + 1
        assert await snapshot(loom_events) == before

    @requires.delete_execution
    @requires.fencing
    async def test_delete_that_finds_no_log_moves_no_token(
        self, loom_events: EventStore
    ) -> None:
        assert await loom_events.delete_execution("exec-none") is False
        assert await token_of(loom_events, "exec-none") == 0
        assert await loom_events.list_executions() == ()

    @requires.delete_execution
    async def test_a_writer_never_lands_between_a_deletes_drop_and_its_token_move(
        self, loom_events: EventStore
    ) -> None:
        """The drop and the token move are one atomic step: a runner of the log (token 0)
        that re-creates it while the delete is under way is refused, either because the log
        is still there (ExecutionAlreadyExistsError) or because the token moved
        (StaleFenceError), at whichever point of the delete its append arrives."""
        for turns in range(MAX_TURNS):
            execution_id = f"exec-del-{turns}"
            await loom_events.append(execution_id, [app(), app()], expected_sequence=0, fence=0)
            race = await race_after_turns(
                loom_events.delete_execution(execution_id),
                functools.partial(
                    loom_events.append, execution_id, [app("zombie")], expected_sequence=0,
                    fence=0,
                ),
                turns,
            )
            assert race.first is True, f"delete_execution({execution_id!r}): {race.first!r}"
            if isinstance(race.second, tuple):
                raise AssertionError(
                    f"an append under token 0 at sequence 0, started when "
                    f"delete_execution({execution_id!r}) had a head start of {turns} loop "
                    "turn(s), landed: the delete dropped "
                    "the log before it moved the token, so a writer of the deleted log "
                    "re-created it in between. Drop the log and move the token in one atomic "
                    "step (no await between them; one transaction)"
                )
            assert isinstance(race.second, ExecutionAlreadyExistsError | StaleFenceError), (
                f"the append racing delete_execution({execution_id!r}) raised "
                f"{race.second!r}; only ExecutionAlreadyExistsError (before the delete) or "
                "StaleFenceError (after it) are possible"
            )
            assert await loom_events.read(execution_id) == ()
            assert await token_of(loom_events, execution_id) == 1

    # -- copy_prefix --------------------------------------------------------------------

    @requires.copy_prefix
    async def test_copy_prefix_branches_a_new_execution(self, loom_events: EventStore) -> None:
        source = await loom_events.append(
            "exec-src", [app(payload=i, trace=str(i)) for i in range(3)], expected_sequence=0
        )
        source += await loom_events.append("exec-src", [app(payload=3)], expected_sequence=3,
                                            fence=0)

        assert await loom_events.copy_prefix("exec-src", "exec-branch", through_sequence=3) == 4
        copied = await loom_events.read("exec-branch")
        assert [(e.execution_id, e.sequence, e.kind, e.payload, e.metadata) for e in copied] == [
            ("exec-branch", e.sequence, e.kind, e.payload, e.metadata) for e in source
        ]
        assert copied[3].metadata["fence"] == 0
        # Each copy keeps its source's time: when the event happened, not when it was copied.
        assert [e.recorded_at for e in copied] == [
            e.recorded_at for e in await loom_events.read("exec-src")
        ], "copy_prefix must keep each source event's recorded_at"

        assert await loom_events.copy_prefix("exec-src", "exec-short", through_sequence=1) == 2
        assert [e.payload for e in await loom_events.read("exec-short")] == [0, 1]
        assert await loom_events.head("exec-short") == 2
        await loom_events.append("exec-short", [app("continued")], expected_sequence=2)
        assert await loom_events.read("exec-src") == source, "the source is untouched"
        assert await loom_events.list_executions() == ("exec-branch", "exec-short", "exec-src")

    @requires.copy_prefix
    async def test_copy_prefix_refusals_change_nothing(self, loom_events: EventStore) -> None:
        await loom_events.append("exec-src", [app(), app()], expected_sequence=0)
        await loom_events.append("exec-taken", [app()], expected_sequence=0)
        before = await snapshot(loom_events, "exec-new")

        with pytest.raises(ExecutionAlreadyExistsError) as exists:
            await loom_events.copy_prefix("exec-src", "exec-taken", through_sequence=0)
        assert exists.value.execution_id == "exec-taken"
        with pytest.raises(InvalidSequenceError):
            await loom_events.copy_prefix("exec-src", "exec-new", through_sequence=2)
        with pytest.raises(ExecutionNotFoundError) as missing:
            await loom_events.copy_prefix("exec-none", "exec-new", through_sequence=0)
        assert missing.value.execution_id == "exec-none"
        with pytest.raises(InvalidInputError):
            await loom_events.copy_prefix("exec-src", "exec-src", through_sequence=0)
        with pytest.raises(InvalidExecutionIdError):
            await loom_events.copy_prefix("exec-src", "bad\x00target", through_sequence=0)
        for through in (-1, True):
            t: Any = through
            with pytest.raises(InvalidSequenceError):
                await loom_events.copy_prefix("exec-src", "exec-new", through_sequence=t)
        assert await snapshot(loom_events, "exec-new") == before

    @requires.copy_prefix
    @requires.delete_execution
    async def test_copy_prefix_keeps_the_targets_own_token(
        self, loom_events: EventStore
    ) -> None:
        """A token lives apart from the log and only moves forward: a copy into an id whose
        deleted log moved its token to 1 leaves it at 1, so a writer of the deleted log
        (token 0) is still refused on the branch."""
        await loom_events.append("exec-branch", [app()], expected_sequence=0, fence=0)
        assert await loom_events.delete_execution("exec-branch") is True
        await loom_events.append("exec-src", [app(), app()], expected_sequence=0)

        assert await loom_events.copy_prefix("exec-src", "exec-branch", through_sequence=1) == 2
        token = await token_of(loom_events, "exec-branch")
        assert token == 1, (
            f"copy_prefix moved the target's token from 1 to {token}: the target keeps its "
            "own token (a token never moves backwards, nor takes the source's)"
        )
        before = await snapshot(loom_events)
        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append("exec-branch", [app("zombie")], expected_sequence=2, fence=0)
        assert caught.value.current_fence == 1
        assert await snapshot(loom_events) == before
        assert await token_of(loom_events, "exec-src") == 0, "the source's token is untouched"

    @requires.copy_prefix
    @requires.acquire_fence
    async def test_copy_prefix_neither_resets_nor_inherits_a_token(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-src", [app(), app()], expected_sequence=0)
        for _ in range(3):
            await loom_events.acquire_fence("exec-src")
        for _ in range(2):
            await loom_events.acquire_fence("exec-branch")  # a token, and no log

        await loom_events.copy_prefix("exec-src", "exec-branch", through_sequence=1)
        tokens = (
            await token_of(loom_events, "exec-src"),
            await token_of(loom_events, "exec-branch"),
        )
        assert tokens == (3, 2), (
            f"after copy_prefix the source's and the target's tokens are {tokens}, not (3, 2): "
            "copy_prefix leaves both tokens as they were"
        )

    @requires.copy_prefix
    async def test_concurrent_copies_to_one_target_have_exactly_one_winner(
        self, loom_events: EventStore
    ) -> None:
        """The check that the target is free and the write of the copy are one atomic step:
        of two copies into one new id, at whichever point of the first the second arrives,
        one wins and the other is ExecutionAlreadyExistsError."""
        a = await loom_events.append("exec-a", [app(payload="a") for _ in range(2)],
                                     expected_sequence=0)
        b = await loom_events.append("exec-b", [app(payload="b") for _ in range(3)],
                                     expected_sequence=0)
        for turns in range(MAX_TURNS):
            target = f"exec-copy-{turns}"
            race = await race_after_turns(
                loom_events.copy_prefix("exec-a", target, through_sequence=1),
                functools.partial(
                    loom_events.copy_prefix, "exec-b", target, through_sequence=2
                ),
                turns,
            )
            if race.first == 2 and race.second == 3:
                raise AssertionError(
                    f"two copy_prefix calls into {target!r} both succeeded (the first had a "
                    f"head start of {turns} loop turn(s)): the check that the "
                    "target has no log and the write of the copy must be one atomic step"
                )
            outcomes = {race.first, race.second} - {2, 3}
            assert len(outcomes) == 1, (turns, race)
            loser = outcomes.pop()
            assert isinstance(loser, ExecutionAlreadyExistsError), (turns, race)
            winner = a[:2] if race.first == 2 else b[:3]
            copied = await loom_events.read(target)
            assert [(e.sequence, e.payload) for e in copied] == [
                (e.sequence, e.payload) for e in winner
            ], f"{target!r} holds {copied!r}, not the winning copy"
            assert await loom_events.head(target) == len(winner)

    # -- truncate_prefix_keeping --------------------------------------------------------

    @requires.truncate_prefix_keeping
    async def test_truncate_prefix_keeps_the_tail_and_the_head(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append(
            "exec-t", [app(payload=i) for i in range(5)], expected_sequence=0
        )
        assert await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=3) == 3
        assert await loom_events.read("exec-t") == written[3:]
        assert await loom_events.read("exec-t", from_sequence=0, limit=1) == written[3:4]
        assert await loom_events.head("exec-t") == 5
        assert await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=3) == 0
        assert await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=1) == 0

        more = await loom_events.append("exec-t", [app("after")], expected_sequence=5)
        assert more[0].sequence == 5
        with pytest.raises(SequenceConflictError) as caught:
            await loom_events.append("exec-t", [app()], expected_sequence=3)
        assert caught.value.actual_head == 6
        assert await loom_events.list_executions() == ("exec-t",)

    @requires.truncate_prefix_keeping
    async def test_truncate_everything_still_keeps_the_head(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-t", [app(), app()], expected_sequence=0)
        assert await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=2) == 2
        assert await loom_events.read("exec-t") == ()
        assert await loom_events.head("exec-t") == 2
        with pytest.raises(ExecutionAlreadyExistsError):
            await loom_events.append("exec-t", [app()], expected_sequence=0)
        assert (await loom_events.append("exec-t", [app()], expected_sequence=2))[0].sequence == 2

    @requires.truncate_prefix_keeping
    async def test_read_after_truncation_selects_by_sequence_not_by_position(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append(
            "exec-t", [app(payload=i) for i in range(6)], expected_sequence=0
        )
        await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=4)

        async def seqs(**kwargs: Any) -> list[int]:
            return [e.sequence for e in await loom_events.read("exec-t", **kwargs)]

        cases: list[tuple[dict[str, int], list[int]]] = [
            ({"from_sequence": 4}, [4, 5]),
            ({"from_sequence": 5}, [5]),
            ({"from_sequence": 2}, [4, 5]),
            ({"from_sequence": 6}, []),
            ({"to_sequence": 4}, [4]),
            ({"to_sequence": 3}, []),
            ({"from_sequence": 3, "to_sequence": 5}, [4, 5]),
            ({"from_sequence": 5, "limit": 1}, [5]),
        ]
        for kwargs, expected in cases:
            got = await seqs(**kwargs)
            assert got == expected, (
                f"after keeping from 4, read(**{kwargs}) gave sequences {got}, not "
                f"{expected}: from_sequence and to_sequence are sequences, not positions "
                "among the events a truncation kept"
            )
        assert await loom_events.read("exec-t", from_sequence=4) == written[4:]

    @requires.truncate_prefix_keeping
    async def test_a_fully_truncated_log_stays_listed(self, loom_events: EventStore) -> None:
        """A log exists until it is deleted: truncating every event keeps its head, so it
        keeps its place in list_executions too."""
        await loom_events.append("exec-a", [app()], expected_sequence=0)
        await loom_events.append("exec-t", [app(), app()], expected_sequence=0)
        await loom_events.append("exec-z", [app()], expected_sequence=0)
        await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=2)

        listed = await loom_events.list_executions()
        assert listed == ("exec-a", "exec-t", "exec-z"), (
            f"list_executions() gave {listed}: a log whose events were all truncated still "
            "exists (its head is 2, a create at 0 is refused) and stays listed until deleted"
        )
        assert await loom_events.list_executions(after="exec-a", limit=1) == ("exec-t",)

    @requires.copy_prefix
    @requires.truncate_prefix_keeping
    async def test_a_copy_of_a_truncated_prefix_ends_where_it_was_asked_to(
        self, loom_events: EventStore
    ) -> None:
        """The copy's head is ``through_sequence + 1`` whatever the source still holds:
        the sequences it copies keep their numbers, and the next append goes after them."""
        written = await loom_events.append(
            "exec-t", [app(payload=i) for i in range(4)], expected_sequence=0
        )
        assert await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=2) == 2
        # Every sequence it asks for is gone: an empty log that ends after them.
        assert await loom_events.copy_prefix("exec-t", "exec-none-left", through_sequence=0) == 0
        assert await loom_events.read("exec-none-left") == ()
        assert await loom_events.head("exec-none-left") == 1
        appended = await loom_events.append("exec-none-left", [app()], expected_sequence=1)
        assert appended[0].sequence == 1
        # Some of them are gone: the rest, at their own sequences.
        assert await loom_events.copy_prefix("exec-t", "exec-some-left", through_sequence=2) == 1
        copied = await loom_events.read("exec-some-left")
        assert [(e.sequence, e.payload) for e in copied] == [(2, written[2].payload)]
        assert await loom_events.head("exec-some-left") == 3
        assert await loom_events.head("exec-t") == 4

    @requires.truncate_prefix_keeping
    async def test_truncate_refusals_change_nothing(self, loom_events: EventStore) -> None:
        await loom_events.append("exec-t", [app(), app()], expected_sequence=0)
        before = await snapshot(loom_events, "exec-none")
        with pytest.raises(InvalidSequenceError):
            await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=3)
        with pytest.raises(ExecutionNotFoundError):
            await loom_events.truncate_prefix_keeping("exec-none", keep_from_sequence=0)
        for keep in (-1, True, "1"):
            k: Any = keep
            with pytest.raises(InvalidSequenceError):
                await loom_events.truncate_prefix_keeping("exec-t", keep_from_sequence=k)
        assert await snapshot(loom_events, "exec-none") == before

    # -- subscribe ----------------------------------------------------------------------

    @requires.subscribe
    async def test_subscribe_yields_existing_then_live_events(
        self, loom_events: EventStore
    ) -> None:
        existing = await loom_events.append(
            "exec-s", [app(payload=0), app(payload=1)], expected_sequence=0
        )
        iterator = loom_events.subscribe("exec-s", from_sequence=0)
        try:
            seen = [await guard(anext(iterator)), await guard(anext(iterator))]
            assert seen == list(existing)

            async def later() -> tuple[Event, ...]:
                await asyncio.sleep(0)
                return await loom_events.append(
                    "exec-s", [app(payload=2), app(payload=3)], expected_sequence=2
                )

            writer = asyncio.ensure_future(later())
            live = [await guard(anext(iterator)), await guard(anext(iterator))]
            assert live == list(await writer)
        finally:
            await close_iterator(iterator)

    @requires.subscribe
    async def test_subscribe_from_a_sequence_skips_earlier_events(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append(
            "exec-s", [app(payload=i) for i in range(4)], expected_sequence=0
        )
        iterator = loom_events.subscribe("exec-s", from_sequence=2)
        try:
            assert [await guard(anext(iterator)) for _ in range(2)] == list(written[2:])
        finally:
            await close_iterator(iterator)

    @requires.subscribe
    async def test_subscribe_to_an_execution_that_does_not_exist_yet(
        self, loom_events: EventStore
    ) -> None:
        iterator = loom_events.subscribe("exec-later", from_sequence=0)
        first = asyncio.ensure_future(anext(iterator))
        try:
            await asyncio.sleep(0)
            written = await loom_events.append("exec-later", [app("born")], expected_sequence=0)
            assert await guard(asyncio.shield(first)) == written[0]
        finally:
            if not first.done():
                first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await close_iterator(iterator)

    @requires.subscribe
    async def test_subscribe_refuses_bad_arguments_when_called(
        self, loom_events: EventStore
    ) -> None:
        """Validation is eager: the error comes from the call, not the first iteration."""
        with pytest.raises(InvalidExecutionIdError):
            loom_events.subscribe("bad\x00id", from_sequence=0)
        for start in (-1, True, "0"):
            s: Any = start
            with pytest.raises(InvalidSequenceError):
                loom_events.subscribe("exec-s", from_sequence=s)

    @requires.subscribe
    async def test_subscribe_delivers_copies_the_caller_cannot_corrupt(
        self, loom_events: EventStore
    ) -> None:
        """A delivered event belongs to its subscriber: changing it changes neither the
        log, nor what another subscription (or a later one) delivers, nor what the
        appender was returned, for an event already in the log and for a live one."""
        written = await loom_events.append("exec-s", [nested(n=0)], expected_sequence=0)
        kept = await loom_events.read("exec-s")
        first = loom_events.subscribe("exec-s", from_sequence=0)
        second = loom_events.subscribe("exec-s", from_sequence=0)
        pending: list[asyncio.Future[Event]] = []
        try:
            scribble([await guard(anext(first))])
            assert await guard(anext(second)) == kept[0], (
                "changing an event one subscription delivered changed what another delivers"
            )

            # Both wait for the next event, so a store that hands one object to every
            # subscriber it wakes hands the same one to both.
            pending = [asyncio.ensure_future(anext(it)) for it in (first, second)]
            await asyncio.sleep(0)
            written += await loom_events.append("exec-s", [nested(n=1)], expected_sequence=1)
            kept = await loom_events.read("exec-s")
            scribble([await guard(asyncio.shield(pending[0]))])
            assert await guard(asyncio.shield(pending[1])) == kept[1], (
                "changing a live event one subscription delivered changed what another "
                "delivers"
            )
        finally:
            for waiting in pending:
                waiting.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await close_iterator(first)
            await close_iterator(second)

        assert await loom_events.read("exec-s") == kept, (
            "changing the events subscribe delivered changed what read returns: subscribe "
            "must deliver copies, not the objects the store keeps"
        )
        assert written == kept, "changing a delivered event changed what append returned"
        later = loom_events.subscribe("exec-s", from_sequence=0)
        try:
            assert [await guard(anext(later)) for _ in kept] == list(kept), (
                "changing delivered events changed what a later subscription delivers"
            )
        finally:
            await close_iterator(later)

    @requires.subscribe
    @pytest.mark.parametrize("closing", ["storage", "event-store"])
    async def test_a_waiting_subscription_ends_when_the_store_is_closed(
        self, loom_storage: Storage, closing: str
    ) -> None:
        """A subscriber waiting for new events is let go by ``close()``, of the storage or
        of its event store alone: its iteration ends, normally or with StoreClosedError
        (both are allowed), and never hangs."""
        events = loom_storage.events
        close = loom_storage.close if closing == "storage" else events.close
        written = await events.append("exec-w", [app()], expected_sequence=0)
        iterator = events.subscribe("exec-w", from_sequence=0)
        waiting: asyncio.Future[Event] | None = None
        try:
            assert await guard(anext(iterator)) == written[0]
            waiting = asyncio.ensure_future(anext(iterator))
            await asyncio.sleep(SETTLE_SECONDS)
            if waiting.done():
                raise AssertionError(
                    f"with nothing new to deliver, the subscription's next item was "
                    f"{_outcome(waiting)} instead of a wait"
                )
            await guard(close())
            await asyncio.wait([waiting], timeout=GUARD_SECONDS)
            if not waiting.done():
                raise AssertionError(
                    f"a subscription waiting for new events was still waiting "
                    f"{GUARD_SECONDS:g} s after close(): closing the store must end it "
                    "(its iteration stops, or raises StoreClosedError)"
                )
            error = waiting.exception()
            if not isinstance(error, StopAsyncIteration | StoreClosedError):
                raise AssertionError(
                    f"after close(), a waiting subscription's next item was "
                    f"{_outcome(waiting)}: it must end (its iteration stops, or raises "
                    "StoreClosedError)"
                )
        finally:
            if waiting is not None and not waiting.done():
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            with contextlib.suppress(StoreClosedError):
                await close_iterator(iterator)


def _outcome(future: asyncio.Future[Event]) -> str:
    """What a finished ``anext`` gave, in words for a failure message."""
    error = future.exception()
    if error is None:
        return f"the event {future.result()!r}"
    if isinstance(error, StopAsyncIteration):
        return "the end of the iteration"
    return f"{type(error).__name__}: {error}"
