"""Answering a park under the conditional fence: :func:`answer_park`.

The rule (docs/design.md, "Resuming a park", and docs/runtime.md, "Parks and resumes"): read
the park, present the token it was written under (``metadata.fence``, 0 when unfenced)
with its sequence to ``acquire_fence_if``; on stale, re-read: a park still unanswered
means someone acquired and never answered (a dead resumer), so try again with the token
the store returned and the same park; anything else means the park is answered or gone.
The fence is the last thing taken; under it the park is checked again against the view
plus one tail read, and the answer is appended at the head that tail gives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from loom_core import (
    Event,
    EventStore,
    ExecutionNotFoundError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    WriteOutcomeUnknownError,
)
from loom_runtime.errors import ResumeContendedError, ResumeRefusedError
from loom_runtime.fold import View, advance, fold

__all__ = ["ACQUIRE_ATTEMPTS", "Answer", "answer_park", "still_parked", "tail_past_conflict"]

ACQUIRE_ATTEMPTS: Final = 3

Answer = Callable[[View], Awaitable[Sequence[NewEvent]]]
"""Builds the events that answer the park, from the freshest view (called before the
acquire, so a refusal takes no token, and again under the fence)."""


def still_parked(view: View, park_seq: int) -> bool:
    return view.park is not None and view.park.sequence == park_seq


async def read_tail(events: EventStore, view: View) -> View:
    return fold(await events.read(view.execution_id, from_sequence=view.head), into=view)


async def tail_past_conflict(events: EventStore, view: View) -> View | None:
    """``view`` advanced past what others appended, after an append of ours at its head
    was refused because the head moved; None when nothing lies past it: the log was
    deleted (or made anew, shorter) under the writer, and a write at the head it knew
    would be refused for ever."""
    tail = await events.read(view.execution_id, from_sequence=view.head)
    return fold(tail, into=view) if tail else None


def _refuse(view: View) -> ResumeRefusedError:
    if view.status is None:
        return ResumeRefusedError(view.execution_id, "not-suspended", "there is no such log")
    if view.terminal:
        return ResumeRefusedError(view.execution_id, "not-suspended", f"it is {view.status}")
    if view.park is not None:
        return ResumeRefusedError(
            view.execution_id, "not-suspended",
            f"its open park is at sequence {view.park.sequence}, not the one given",
        )
    owner = f" under node {view.node!r}" if view.node else ""
    return ResumeRefusedError(
        view.execution_id,
        "not-suspended",
        f"it is running{owner}, with no park open: a run carries it on, or, if that run "
        f"stopped (its process died, its replay diverged), the next start of that node or "
        f"app.recover() there does",
    )


async def answer_park(
    events: EventStore,
    view: View,
    park_seq: int,
    answer: Answer,
    *,
    checked: Callable[[View], Awaitable[None]] | None = None,
    writing: Callable[[View, Sequence[NewEvent]], None] | None = None,
    lost: Callable[[int, int, Sequence[NewEvent]], None] | None = None,
) -> tuple[int, View, tuple[Event, ...]]:
    """Answer the park at ``park_seq`` of ``view``'s execution; return the token now held,
    the view advanced past the answer, and the events written.

    ``checked`` runs after every check that can refuse without writing (the authorisation
    hook goes there), just before the first acquire; ``writing`` is told of each batch
    just before it is appended (``answer`` builds one more, to refuse early, that is
    never written); ``lost`` of the sequence, token and batch of an append whose outcome
    was not learned (WriteOutcomeUnknownError, raised on). Raises ResumeRefusedError (nothing
    appended, no token taken) or ResumeContendedError (after ACQUIRE_ATTEMPTS stale
    acquisitions with the park still unanswered).
    """
    if not still_parked(view, park_seq):
        raise _refuse(view)
    await answer(view)  # refuses (nothing to answer) before any token is taken
    if checked is not None:
        await checked(view)
    assert view.park is not None
    expected = view.park.fence
    capabilities = events.capabilities
    execution_id = view.execution_id
    for _attempt in range(ACQUIRE_ATTEMPTS):
        if "acquire_fence_if" in capabilities:
            try:
                outcome = await events.acquire_fence_if(
                    execution_id, fence=expected, park_seq=park_seq
                )
            except ExecutionNotFoundError:
                raise ResumeRefusedError(
                    execution_id, "not-suspended", "its log was deleted while it was resumed"
                ) from None
            if not outcome.acquired:
                view = await read_tail(events, view)
                if not still_parked(view, park_seq):
                    raise _refuse(view)
                expected = outcome.fence  # a dead acquirer moved it; the park is still open
                continue
            token = outcome.fence
        elif "acquire_fence" in capabilities:
            # Without the conditional method: look at the log once more, then the
            # unconditional acquire, then the re-check below. The look keeps a resumer of
            # this app from fencing out the run another one started: they take turns, so
            # the one before has written its answer by now. A rival in another process can
            # still answer between the look and the acquire, and its running body is then
            # fenced out: what the conditional method is for (docs/design.md).
            view = await read_tail(events, view)
            if not still_parked(view, park_seq):
                raise _refuse(view)
            token = await events.acquire_fence(execution_id)
        else:
            # A store that does not fence: the sequence check alone orders resumers.
            token = expected
        view = await read_tail(events, view)
        while True:
            if not still_parked(view, park_seq):
                raise _refuse(view)
            batch = await answer(view)
            if writing is not None:
                writing(view, batch)
            try:
                written = await events.append(
                    execution_id, batch, expected_sequence=view.head, fence=token
                )
            except SequenceConflictError:
                moved = await tail_past_conflict(events, view)
                if moved is None:
                    raise ResumeRefusedError(
                        execution_id, "not-suspended", "its log was deleted while it was resumed"
                    ) from None
                view = moved  # an unfenced audit append: step over it
                continue
            except WriteOutcomeUnknownError:
                if lost is not None:
                    lost(view.head, token, batch)
                raise
            except StaleFenceError as exc:
                # A rival acquired between our acquire and our append: a clean refusal;
                # re-read, and if the park is still open try again under its token.
                view = await read_tail(events, view)
                expected = exc.current_fence
                break
            return token, advance(view, written), written  # ``view`` is our own copy
        if not still_parked(view, park_seq):
            raise _refuse(view)
    raise ResumeContendedError(execution_id, ACQUIRE_ATTEMPTS)
