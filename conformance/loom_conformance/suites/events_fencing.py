"""Fencing: StaleFenceError on append, ``acquire_fence``, ``acquire_fence_if`` (every case
of docs/design.md, "The conditional acquire") and ``append_if_unchanged``."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import pytest

from loom_conformance.requirements import requires
from loom_conformance.suites._races import MAX_TURNS, race_after_turns
from loom_conformance.suites._support import (
    SAME_VALUES,
    app,
    assert_the_same_values,
    bump_token,
    guard,
    kernel,
    park,
    snapshot,
    token_of,
)
from loom_core import (
    AppendRequest,
    ConflictError,
    EventKind,
    EventStore,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceAcquired,
    FenceNotIssuedError,
    FenceStale,
    InvalidEventError,
    InvalidInputError,
    InvalidSequenceError,
    JsonValue,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
)
from loom_core.spi import ANSWERING_KINDS

__all__ = ["EventStoreFencingContract"]

NOT_ANSWERING: Final[tuple[EventKind, ...]] = (
    EventKind.EXECUTION_DENIED,
    EventKind.OUTCOME_RECORDED,
    EventKind.STEP_FAILED,
    EventKind.MESSAGE_CONSUMED,
    EventKind.EXECUTION_MIGRATED,
    EventKind.STEP_COMPLETED,
)
"""Ignorable kinds that may follow a park without answering it (audit appends)."""

UNKNOWN_KIND: Final = "KERNEL_KIND_FROM_A_NEWER_NODE"


class EventStoreFencingContract:
    """Tokens: what an append presents, and the two ways to take one."""

    # -- StaleFenceError on append ------------------------------------------------------

    @requires.fencing
    async def test_append_under_an_old_token_is_stale_and_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app()], expected_sequence=0, fence=0)
        token = await bump_token(loom_events, "exec-1")
        assert token == 1
        before = await snapshot(loom_events)

        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append("exec-1", [app()], expected_sequence=1, fence=0)
        assert caught.value.current_fence == 1
        assert caught.value.presented_fence == 0
        assert caught.value.execution_id == "exec-1"
        assert isinstance(caught.value, ConflictError)
        assert await snapshot(loom_events) == before

        written = await loom_events.append("exec-1", [app()], expected_sequence=1, fence=1)
        assert written[0].metadata["fence"] == 1
        assert written[0].fence == 1

    @requires.fencing
    async def test_unfenced_append_is_not_checked_against_the_token(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app()], expected_sequence=0)
        await bump_token(loom_events, "exec-1")
        await bump_token(loom_events, "exec-1")
        denied = await loom_events.append(
            "exec-1", [kernel(EventKind.EXECUTION_DENIED)], expected_sequence=1
        )
        assert denied[0].sequence == 1
        assert "fence" not in denied[0].metadata

    @requires.fencing
    async def test_a_token_is_kept_for_an_execution_with_no_log(
        self, loom_events: EventStore
    ) -> None:
        token = await bump_token(loom_events, "exec-later")
        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append("exec-later", [app()], expected_sequence=0, fence=token - 1)
        assert caught.value.current_fence == token
        assert await loom_events.head("exec-later") == 0

    @requires.fencing
    async def test_a_token_that_was_never_issued_is_refused_and_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        """A number above the current token was never returned by an acquire; accepting
        it would let a caller's bug outrank every later acquire."""
        await loom_events.append("exec-1", [app()], expected_sequence=0, fence=0)
        token = await bump_token(loom_events, "exec-1")
        before = await snapshot(loom_events, "exec-none")
        for presented in (token + 1, 100):
            with pytest.raises(FenceNotIssuedError) as caught:
                await loom_events.append("exec-1", [app()], expected_sequence=1, fence=presented)
            assert (caught.value.execution_id, caught.value.presented_fence) == (
                "exec-1", presented)
            assert caught.value.current_fence == token
            assert isinstance(caught.value, InvalidInputError)
        with pytest.raises(FenceNotIssuedError) as none_yet:
            await loom_events.append("exec-none", [app()], expected_sequence=0, fence=1)
        assert none_yet.value.current_fence == 0
        assert await snapshot(loom_events, "exec-none") == before

        # Still refused once later acquires pass it by: 100 is never the holder's.
        newer = await bump_token(loom_events, "exec-1")
        assert newer == token + 1
        with pytest.raises(FenceNotIssuedError):
            await loom_events.append("exec-1", [app()], expected_sequence=1, fence=100)
        with pytest.raises(StaleFenceError):
            await loom_events.append("exec-1", [app()], expected_sequence=1, fence=token)
        written = await loom_events.append("exec-1", [app()], expected_sequence=1, fence=newer)
        assert written[0].fence == newer

    @requires.fencing
    async def test_a_moved_head_is_reported_before_a_token_never_issued(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app(), app()], expected_sequence=0)
        with pytest.raises(SequenceConflictError):
            await loom_events.append("exec-1", [app()], expected_sequence=1, fence=7)
        with pytest.raises(ExecutionAlreadyExistsError):
            await loom_events.append("exec-1", [app()], expected_sequence=0, fence=7)

    @requires.append_many
    @requires.fencing
    async def test_append_many_refuses_a_token_never_issued_and_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-a", [app()], expected_sequence=0)
        token = await bump_token(loom_events, "exec-a")
        before = await snapshot(loom_events, "exec-b")
        with pytest.raises(FenceNotIssuedError) as caught:
            await loom_events.append_many([
                AppendRequest("exec-b", [app()], 0),
                AppendRequest("exec-a", [app()], 1, fence=token + 3),
            ])
        assert caught.value.current_fence == token
        assert await snapshot(loom_events, "exec-b") == before

    @requires.fencing
    async def test_a_moved_head_is_reported_before_a_stale_token(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app(), app()], expected_sequence=0)
        await bump_token(loom_events, "exec-1")
        before = await snapshot(loom_events)
        with pytest.raises(SequenceConflictError) as moved:
            await loom_events.append("exec-1", [app()], expected_sequence=1, fence=0)
        assert moved.value.actual_head == 2
        with pytest.raises(ExecutionAlreadyExistsError):
            await loom_events.append("exec-1", [app()], expected_sequence=0, fence=0)
        assert await snapshot(loom_events) == before

    # -- acquire_fence ------------------------------------------------------------------

    @requires.acquire_fence
    async def test_acquire_fence_returns_the_next_token_and_fences_the_old_holder(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app()], expected_sequence=0)
        assert await loom_events.acquire_fence("exec-1") == 1
        await loom_events.append("exec-1", [app()], expected_sequence=1, fence=1)
        assert await loom_events.acquire_fence("exec-1") == 2

        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append("exec-1", [app()], expected_sequence=2, fence=1)
        assert caught.value.current_fence == 2
        assert await loom_events.head("exec-1") == 2
        assert await loom_events.acquire_fence("other") == 1, "tokens are per execution"

    @requires.acquire_fence
    async def test_concurrent_acquire_fence_hands_out_distinct_tokens(
        self, loom_events: EventStore
    ) -> None:
        tokens = await guard(
            asyncio.gather(*(loom_events.acquire_fence("exec-1") for _ in range(8)))
        )
        assert sorted(tokens) == list(range(1, 9))

    # -- acquire_fence_if (docs/design.md, "The conditional acquire") -------------------

    @requires.acquire_fence_if
    async def test_conditional_acquire_returns_the_next_token_and_fences_the_old_holder(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1", fence=0)
        result = await loom_events.acquire_fence_if("exec-1", fence=0, park_seq=park_seq)
        assert result == FenceAcquired(1)
        assert result.acquired is True

        with pytest.raises(StaleFenceError) as caught:
            await loom_events.append(
                "exec-1", [app()], expected_sequence=park_seq + 1, fence=0
            )
        assert caught.value.current_fence == 1
        resumed = await loom_events.append(
            "exec-1", [kernel(EventKind.EXECUTION_RESUMED)], expected_sequence=park_seq + 1,
            fence=1,
        )
        assert resumed[0].fence == 1

    @requires.acquire_fence_if
    async def test_conditional_acquire_on_a_park_written_under_a_token(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append(
            "exec-1", [kernel(EventKind.EXECUTION_STARTED)], expected_sequence=0
        )
        token = await bump_token(loom_events, "exec-1")
        park_seq = await park(loom_events, "exec-1", fence=token)
        parked = (await loom_events.read("exec-1", from_sequence=park_seq))[0]
        assert parked.fence == token

        result = await loom_events.acquire_fence_if("exec-1", fence=parked.fence, park_seq=park_seq)
        assert result == FenceAcquired(token + 1)

    @requires.acquire_fence_if
    @pytest.mark.parametrize("presented", [1, 2, 5], ids=["ahead-1", "ahead-2", "ahead-5"])
    async def test_moved_token_is_stale_returns_the_current_one_and_changes_nothing(
        self, loom_events: EventStore, presented: int
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        before = await snapshot(loom_events)

        result = await loom_events.acquire_fence_if("exec-1", fence=presented, park_seq=park_seq)
        assert result == FenceStale(0)
        assert result.acquired is False
        assert await snapshot(loom_events) == before
        # Unchanged: the holder of token 0 still writes, and 0 still acquires.
        await loom_events.append("exec-1", [app()], expected_sequence=park_seq + 1, fence=0)
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    @requires.acquire_fence_if
    async def test_token_behind_the_current_one_is_stale_and_unchanged(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceStale(1)
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceStale(1), "a stale answer must not have moved the token"
        await loom_events.append("exec-1", [app()], expected_sequence=park_seq + 1, fence=1)

    @requires.acquire_fence_if
    async def test_eight_concurrent_conditional_acquires_have_exactly_one_winner(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        results = await guard(
            asyncio.gather(
                *(
                    loom_events.acquire_fence_if("exec-1", fence=0, park_seq=park_seq)
                    for _ in range(8)
                )
            )
        )
        assert [r for r in results if r.acquired] == [FenceAcquired(1)]
        assert [r for r in results if not r.acquired] == [FenceStale(1)] * 7

    @requires.acquire_fence_if
    @pytest.mark.parametrize("kind", sorted(ANSWERING_KINDS))
    async def test_answering_kind_past_the_park_is_stale_with_a_matching_token(
        self, loom_events: EventStore, kind: str
    ) -> None:
        park_seq = await park(loom_events, "exec-1", fence=0)
        await loom_events.append(
            "exec-1", [NewEvent(kind)], expected_sequence=park_seq + 1, fence=0
        )
        before = await snapshot(loom_events)

        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceStale(0)
        assert await snapshot(loom_events) == before
        # The token did not move: the answering writer (token 0) is still the holder.
        await loom_events.append("exec-1", [app()], expected_sequence=park_seq + 2, fence=0)

    @requires.acquire_fence_if
    async def test_answering_kind_past_the_park_behind_ignorable_events_is_stale(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        await loom_events.append(
            "exec-1",
            [kernel(EventKind.EXECUTION_DENIED), app(), kernel(EventKind.EXECUTION_RESUMED),
             kernel(EventKind.STEP_COMPLETED)],
            expected_sequence=park_seq + 1,
        )
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceStale(0)

    @requires.acquire_fence_if
    @pytest.mark.parametrize("kind", sorted(ANSWERING_KINDS))
    async def test_answering_kind_at_or_before_the_park_is_not_stale(
        self, loom_events: EventStore, kind: str
    ) -> None:
        await loom_events.append(
            "exec-1", [kernel(EventKind.EXECUTION_STARTED), NewEvent(kind)], expected_sequence=0
        )
        park_seq = await park(loom_events, "exec-1")
        # The park itself (EXECUTION_SUSPENDED, answering) sits AT park_seq.
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    @requires.acquire_fence_if
    @pytest.mark.parametrize("kind", [k.value for k in NOT_ANSWERING] + ["order.shipped"])
    async def test_ignorable_kind_past_the_park_is_not_stale(
        self, loom_events: EventStore, kind: str
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        # Written unfenced, as the audit appends that follow a park are.
        await loom_events.append(
            "exec-1", [NewEvent(kind, {"why": "audit"})], expected_sequence=park_seq + 1
        )
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    @requires.acquire_fence_if
    async def test_unknown_kind_stamped_kernel_true_past_the_park_is_stale(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        await loom_events.append(
            "exec-1", [app(UNKNOWN_KIND, kernel=True)], expected_sequence=park_seq + 1
        )
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceStale(0)

    @requires.acquire_fence_if
    @pytest.mark.parametrize(
        "stamp",
        [None, "true", "True", 1, False, {"nested": True}],
        ids=["unstamped", "string-true", "string-True", "one", "false", "object"],
    )
    async def test_unknown_kind_not_stamped_with_json_true_past_the_park_is_not_stale(
        self, loom_events: EventStore, stamp: JsonValue
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        metadata: dict[str, JsonValue] = {} if stamp is None else {"kernel": stamp}
        await loom_events.append(
            "exec-1", [NewEvent(UNKNOWN_KIND, None, metadata)], expected_sequence=park_seq + 1
        )
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    @requires.acquire_fence_if
    async def test_kernel_kind_is_classified_by_its_kind_not_its_stamp(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        await loom_events.append(
            "exec-1", [NewEvent(EventKind.STEP_COMPLETED.value, None, {"kernel": True})],
            expected_sequence=park_seq + 1,
        )
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    @requires.acquire_fence_if
    async def test_answering_append_racing_a_conditional_acquire_never_both_succeed(
        self, loom_events: EventStore
    ) -> None:
        """The race the conditional acquire closes: either the resume lands and the
        acquire is stale, or the acquire wins and the resume is StaleFenceError; never
        both, never neither."""
        for round_ in range(16):
            execution_id = f"exec-race-{round_:02d}"
            park_seq = await park(loom_events, execution_id, fence=0)
            resume = loom_events.append(
                execution_id, [kernel(EventKind.EXECUTION_RESUMED)],
                expected_sequence=park_seq + 1, fence=0,
            )
            acquire = loom_events.acquire_fence_if(execution_id, fence=0, park_seq=park_seq)
            pair = (resume, acquire) if round_ % 2 else (acquire, resume)
            first, second = await guard(asyncio.gather(*pair, return_exceptions=True))
            appended, acquired = (first, second) if round_ % 2 else (second, first)
            if isinstance(appended, tuple):
                assert acquired == FenceStale(0), (round_, acquired)
            else:
                assert isinstance(appended, StaleFenceError), (round_, appended)
                assert acquired == FenceAcquired(1), (round_, acquired)
            resumes = [
                e for e in await loom_events.read(execution_id)
                if e.kind == EventKind.EXECUTION_RESUMED
            ]
            assert len(resumes) == (1 if isinstance(appended, tuple) else 0)

    @requires.acquire_fence_if
    async def test_dead_acquirer_is_retried_with_the_returned_token(
        self, loom_events: EventStore
    ) -> None:
        """The retry: a crashed resumer took a token and never appended; the park is still
        unanswered, so the retry with the token the store returned wins."""
        park_seq = await park(loom_events, "exec-1")
        await loom_events.acquire_fence_if("exec-1", fence=0, park_seq=park_seq)  # then dies
        stale = await loom_events.acquire_fence_if("exec-1", fence=0, park_seq=park_seq)
        assert stale == FenceStale(1)
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=stale.fence, park_seq=park_seq
        ) == FenceAcquired(2)

    @requires.acquire_fence_if
    async def test_retry_after_a_committed_resume_is_stale(
        self, loom_events: EventStore
    ) -> None:
        """Why also the park: the winner's resume does not move the token, so a rival that
        re-read the token would match it; the answered park refuses it instead."""
        park_seq = await park(loom_events, "exec-1")
        won = await loom_events.acquire_fence_if("exec-1", fence=0, park_seq=park_seq)
        assert won == FenceAcquired(1)
        await loom_events.append(
            "exec-1", [kernel(EventKind.EXECUTION_RESUMED)], expected_sequence=park_seq + 1,
            fence=1,
        )
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=1, park_seq=park_seq
        ) == FenceStale(1)
        await loom_events.append("exec-1", [app()], expected_sequence=park_seq + 2, fence=1)

    @requires.acquire_fence_if
    async def test_conditional_acquire_refuses_an_execution_with_no_log(
        self, loom_events: EventStore
    ) -> None:
        before = await snapshot(loom_events, "exec-none")
        with pytest.raises(ExecutionNotFoundError) as caught:
            await loom_events.acquire_fence_if("exec-none", fence=0, park_seq=0)
        assert caught.value.execution_id == "exec-none"
        assert await snapshot(loom_events, "exec-none") == before
        assert await token_of(loom_events, "exec-none") == 0, "no token was taken"

    @requires.acquire_fence_if
    async def test_conditional_acquire_refuses_a_park_seq_at_or_past_the_head(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        head = await loom_events.head("exec-1")
        before = await snapshot(loom_events)
        for seq in (head, head + 1, head + 1000):
            with pytest.raises(InvalidSequenceError, match="head"):
                await loom_events.acquire_fence_if("exec-1", fence=0, park_seq=seq)
        assert await snapshot(loom_events) == before
        assert await token_of(loom_events, "exec-1") == 0, "no token was taken"
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    @requires.acquire_fence_if
    async def test_conditional_acquire_refuses_bad_arguments(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        before = await snapshot(loom_events)
        for fence, seq in ((-1, park_seq), (True, park_seq), (0, -1), (0, True), (0, 1.0),
                           ("0", park_seq)):
            f: Any = fence
            s: Any = seq
            with pytest.raises(InvalidSequenceError):
                await loom_events.acquire_fence_if("exec-1", fence=f, park_seq=s)
        assert await snapshot(loom_events) == before
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    # -- append_if_unchanged ------------------------------------------------------------

    @requires.append_if_unchanged
    async def test_append_if_unchanged_appends_while_the_token_is_the_observed_one(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append_if_unchanged(
            "exec-1", [app(trace="x"), app()], expected_sequence=0, observed_fence=0
        )
        assert [e.sequence for e in written] == [0, 1]
        assert [e.metadata for e in written] == [{"trace": "x"}, {}], "it stamps no fence"
        assert await loom_events.read("exec-1") == written

    @requires.append_if_unchanged
    async def test_append_if_unchanged_payloads_read_back_with_their_types_and_key_order(
        self, loom_events: EventStore
    ) -> None:
        written = await loom_events.append_if_unchanged(
            "exec-types", [NewEvent("k", p) for p in SAME_VALUES], expected_sequence=0,
            observed_fence=0,
        )
        assert_the_same_values("append_if_unchanged", written)
        assert_the_same_values(
            "read after append_if_unchanged", await loom_events.read("exec-types")
        )

    @requires.append_if_unchanged
    @requires.fencing
    async def test_append_if_unchanged_refuses_a_moved_token_and_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app()], expected_sequence=0)
        token = await bump_token(loom_events, "exec-1")
        before = await snapshot(loom_events)
        for observed in (token - 1, token + 1):
            with pytest.raises(StaleFenceError) as caught:
                await loom_events.append_if_unchanged(
                    "exec-1", [app()], expected_sequence=1, observed_fence=observed
                )
            assert caught.value.current_fence == token
            assert caught.value.presented_fence == observed
        assert await snapshot(loom_events) == before

        written = await loom_events.append_if_unchanged(
            "exec-1", [app()], expected_sequence=1, observed_fence=token
        )
        assert "fence" not in written[0].metadata

    @requires.append_if_unchanged
    @requires.acquire_fence_if
    async def test_append_if_unchanged_never_bumps_the_token(
        self, loom_events: EventStore
    ) -> None:
        park_seq = await park(loom_events, "exec-1")
        await loom_events.append_if_unchanged(
            "exec-1", [app()], expected_sequence=park_seq + 1, observed_fence=0
        )
        await loom_events.append_if_unchanged(
            "exec-1", [app()], expected_sequence=park_seq + 2, observed_fence=0
        )
        assert await loom_events.acquire_fence_if(
            "exec-1", fence=0, park_seq=park_seq
        ) == FenceAcquired(1)

    @requires.append_if_unchanged
    @requires.fencing
    async def test_append_if_unchanged_never_lands_after_a_token_move_it_did_not_see(
        self, loom_events: EventStore
    ) -> None:
        """The token check and the write are one atomic step. A new owner takes the token
        and then reads the head: if the old owner's append under the observed token
        succeeded, it was in the log before the token moved, so the new owner saw it.
        Otherwise it is StaleFenceError, at whichever point of it the acquire arrives."""
        for turns in range(MAX_TURNS):
            execution_id = f"exec-aiu-{turns}"
            await loom_events.append(execution_id, [app()], expected_sequence=0)

            async def take_over(execution_id: str = execution_id) -> tuple[int, int]:
                token = await bump_token(loom_events, execution_id)
                return token, await loom_events.head(execution_id)

            race = await race_after_turns(
                loom_events.append_if_unchanged(
                    execution_id, [app("old owner")], expected_sequence=1, observed_fence=0
                ),
                take_over,
                turns,
            )
            assert isinstance(race.second, tuple), f"the takeover failed: {race.second!r}"
            token, head_seen = race.second
            if isinstance(race.first, tuple) and head_seen == 1:
                raise AssertionError(
                    f"append_if_unchanged(observed_fence=0) to {execution_id!r} landed after "
                    f"an acquire moved the token to {token} and the new owner read head 1 "
                    f"(the append had a head start of {turns} loop turn(s)): "
                    "the token check and the write must be one atomic step, or an append "
                    "under an old token lands behind the new owner's back"
                )
            if not isinstance(race.first, tuple):
                assert isinstance(race.first, StaleFenceError), (turns, race)
                assert race.first.current_fence == token
                assert await loom_events.head(execution_id) == 1

    @requires.append_if_unchanged
    async def test_append_if_unchanged_still_checks_the_sequence(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app(), app()], expected_sequence=0)
        before = await snapshot(loom_events)
        with pytest.raises(SequenceConflictError) as caught:
            await loom_events.append_if_unchanged(
                "exec-1", [app()], expected_sequence=1, observed_fence=0
            )
        assert caught.value.actual_head == 2
        with pytest.raises(ConflictError):
            await loom_events.append_if_unchanged(
                "exec-1", [app()], expected_sequence=0, observed_fence=0
            )
        assert await snapshot(loom_events) == before

    @requires.append_if_unchanged
    async def test_append_if_unchanged_refuses_bad_input_and_writes_nothing(
        self, loom_events: EventStore
    ) -> None:
        await loom_events.append("exec-1", [app()], expected_sequence=0)
        before = await snapshot(loom_events)
        with pytest.raises(InvalidEventError):
            await loom_events.append_if_unchanged(
                "exec-1", [app(), NewEvent("k", None, {"fence": 1})], expected_sequence=1,
                observed_fence=0,
            )
        with pytest.raises(InvalidEventError):
            await loom_events.append_if_unchanged(
                "exec-1", [], expected_sequence=1, observed_fence=0
            )
        for observed in (-1, True, None):
            o: Any = observed
            with pytest.raises(InvalidSequenceError):
                await loom_events.append_if_unchanged(
                    "exec-1", [app()], expected_sequence=1, observed_fence=o
                )
        assert await snapshot(loom_events) == before
