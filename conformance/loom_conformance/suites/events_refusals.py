"""A refused write changes nothing: the whole store, compared before and after each refusal.

Every case builds a small store (two logs, one fenced, one parked), makes one call the
contract says must be refused, checks the error's type, and compares everything a caller
can observe: every listed execution with its head and log, and every execution's token
(read with :func:`~loom_conformance.suites._support.token_of`, which writes nothing). A
store that half-applies a batch, leaves a fence row behind, or takes a token on a refusal
fails here with the two states side by side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import pytest

from loom_conformance.requirements import missing, requires
from loom_conformance.suites._support import (
    Snapshot,
    app,
    bump_token,
    kernel,
    park,
    snapshot,
    token_of,
)
from loom_core import (
    AppendRequest,
    EventKind,
    EventStore,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceNotIssuedError,
    FenceStale,
    InvalidEventError,
    InvalidSequenceError,
    LoomError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
)
from loom_core.spi import OptionalMethod

__all__ = ["REFUSALS", "EventStoreRefusalContract", "Refusal"]

FENCED: Final = "exec-fenced"
"""Three events, token 1 (the first event written under token 0)."""
PARKED: Final = "exec-parked"
"""Started and parked unfenced, then answered by an EXECUTION_RESUMED; token 0."""
NEW: Final = "exec-new"
"""No log, no token."""
IDS: Final = (FENCED, PARKED, NEW)

HUGE: Final = 1 << 14_100
"""An integer no store can encode as JSON text within Python's default limit."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """One call the contract refuses, and the error it must raise."""

    name: str
    call: Callable[[EventStore], Awaitable[object]]
    error: type[LoomError]
    needs: tuple[OptionalMethod, ...] = ()


REFUSALS: Final[tuple[Refusal, ...]] = (
    Refusal(
        "append-stale-token",
        lambda s: s.append(FENCED, [app()], expected_sequence=3, fence=0),
        StaleFenceError,
    ),
    Refusal(
        "append-token-never-issued",
        lambda s: s.append(FENCED, [app()], expected_sequence=3, fence=2),
        FenceNotIssuedError,
    ),
    Refusal(
        "append-token-never-issued-no-log",
        lambda s: s.append(NEW, [app()], expected_sequence=0, fence=1),
        FenceNotIssuedError,
    ),
    Refusal(
        "append-moved-head",
        lambda s: s.append(FENCED, [app()], expected_sequence=2, fence=1),
        SequenceConflictError,
    ),
    Refusal(
        "append-existing",
        lambda s: s.append(PARKED, [app()], expected_sequence=0),
        ExecutionAlreadyExistsError,
    ),
    Refusal(
        "append-past-zero-to-no-log",
        lambda s: s.append(NEW, [app()], expected_sequence=4),
        SequenceConflictError,
    ),
    Refusal(
        "append-huge-integer-last",
        lambda s: s.append(FENCED, [app(), app(payload=HUGE)], expected_sequence=3, fence=1),
        InvalidEventError,
    ),
    Refusal(
        "append-reserved-metadata",
        lambda s: s.append(NEW, [NewEvent("k", None, {"fence": 9})], expected_sequence=0),
        InvalidEventError,
    ),
    Refusal(
        "append-many-huge-integer-in-a-later-request",
        lambda s: s.append_many([
            AppendRequest(NEW, [app()], 0),
            AppendRequest(FENCED, [app()], 3, fence=1),
            AppendRequest(PARKED, [app(payload={"n": HUGE})], 4),
        ]),
        InvalidEventError,
        ("append_many",),
    ),
    Refusal(
        "append-many-conflict-in-a-later-request",
        lambda s: s.append_many([
            AppendRequest(NEW, [app()], 0),
            AppendRequest(FENCED, [app()], 3, fence=1),
            AppendRequest(PARKED, [app()], 1),
        ]),
        SequenceConflictError,
        ("append_many",),
    ),
    Refusal(
        "append-many-stale-token-in-a-later-request",
        lambda s: s.append_many([
            AppendRequest(NEW, [app()], 0),
            AppendRequest(FENCED, [app()], 3, fence=0),
        ]),
        StaleFenceError,
        ("append_many",),
    ),
    Refusal(
        "append-many-token-never-issued-in-a-later-request",
        lambda s: s.append_many([
            AppendRequest(PARKED, [app()], 3),
            AppendRequest(FENCED, [app()], 3, fence=5),
        ]),
        FenceNotIssuedError,
        ("append_many",),
    ),
    Refusal(
        "append-if-unchanged-stale",
        lambda s: s.append_if_unchanged(FENCED, [app()], expected_sequence=3, observed_fence=0),
        StaleFenceError,
        ("append_if_unchanged",),
    ),
    Refusal(
        "append-if-unchanged-stale-no-log",
        lambda s: s.append_if_unchanged(NEW, [app()], expected_sequence=0, observed_fence=1),
        StaleFenceError,
        ("append_if_unchanged",),
    ),
    Refusal(
        "append-if-unchanged-moved-head",
        lambda s: s.append_if_unchanged(FENCED, [app()], expected_sequence=1, observed_fence=1),
        SequenceConflictError,
        ("append_if_unchanged",),
    ),
    Refusal(
        "append-if-unchanged-past-zero-to-no-log",
        lambda s: s.append_if_unchanged(NEW, [app()], expected_sequence=2, observed_fence=0),
        SequenceConflictError,
        ("append_if_unchanged",),
    ),
    Refusal(
        "acquire-fence-if-no-log",
        lambda s: s.acquire_fence_if(NEW, fence=0, park_seq=0),
        ExecutionNotFoundError,
        ("acquire_fence_if",),
    ),
    Refusal(
        "acquire-fence-if-at-the-head",
        lambda s: s.acquire_fence_if(PARKED, fence=0, park_seq=3),
        InvalidSequenceError,
        ("acquire_fence_if",),
    ),
    Refusal(
        "copy-prefix-onto-an-existing-log",
        lambda s: s.copy_prefix(FENCED, PARKED, through_sequence=1),
        ExecutionAlreadyExistsError,
        ("copy_prefix",),
    ),
    Refusal(
        "copy-prefix-past-the-head",
        lambda s: s.copy_prefix(FENCED, NEW, through_sequence=3),
        InvalidSequenceError,
        ("copy_prefix",),
    ),
    Refusal(
        "copy-prefix-of-no-log",
        lambda s: s.copy_prefix(NEW, "exec-copy", through_sequence=0),
        ExecutionNotFoundError,
        ("copy_prefix",),
    ),
    Refusal(
        "truncate-past-the-head",
        lambda s: s.truncate_prefix_keeping(FENCED, keep_from_sequence=4),
        InvalidSequenceError,
        ("truncate_prefix_keeping",),
    ),
    Refusal(
        "truncate-no-log",
        lambda s: s.truncate_prefix_keeping(NEW, keep_from_sequence=0),
        ExecutionNotFoundError,
        ("truncate_prefix_keeping",),
    ),
)
"""Every refusal the kit checks for an unchanged store."""


@dataclass(frozen=True, slots=True)
class _State:
    observed: Snapshot
    tokens: tuple[int, ...]


async def _state(store: EventStore) -> _State:
    return _State(
        await snapshot(store, *IDS, "exec-copy"),
        tuple([await token_of(store, i) for i in (*IDS, "exec-copy")]),
    )


async def _build(store: EventStore) -> None:
    await store.append(FENCED, [kernel(EventKind.EXECUTION_STARTED)], expected_sequence=0,
                       fence=0)
    await bump_token(store, FENCED)
    await store.append(FENCED, [app(), app()], expected_sequence=1, fence=1)
    park_seq = await park(store, PARKED)
    await store.append(PARKED, [kernel(EventKind.EXECUTION_RESUMED)],
                       expected_sequence=park_seq + 1)


class EventStoreRefusalContract:
    """Each refused write leaves the whole store as it was."""

    @requires.fencing
    @pytest.mark.parametrize("refusal", REFUSALS, ids=[r.name for r in REFUSALS])
    async def test_a_refused_write_leaves_the_whole_store_as_it_was(
        self, loom_events: EventStore, refusal: Refusal
    ) -> None:
        reason = missing(frozenset(loom_events.capabilities), tuple(refusal.needs), ())
        if reason is not None:
            pytest.skip(reason)
        await _build(loom_events)
        before = await _state(loom_events)
        assert before.tokens == (1, 0, 0, 0)

        with pytest.raises(refusal.error):
            await refusal.call(loom_events)

        after = await _state(loom_events)
        assert after.tokens == before.tokens, "a refusal moved a token"
        assert after.observed == before.observed, "a refusal changed the logs"

    @requires.acquire_fence_if
    @requires.fencing
    async def test_a_stale_conditional_acquire_leaves_the_whole_store_as_it_was(
        self, loom_events: EventStore
    ) -> None:
        await _build(loom_events)
        before = await _state(loom_events)
        # Answered park, then a token that moved: both stale, neither changes anything.
        assert await loom_events.acquire_fence_if(PARKED, fence=0, park_seq=1) == FenceStale(0)
        assert await loom_events.acquire_fence_if(FENCED, fence=0, park_seq=2) == FenceStale(1)
        assert await _state(loom_events) == before
