"""``python -m loom_core demo``: a park resumed under a conditional fence, end to end.

It plays the conditional acquire's hard case (see docs/design.md, "The conditional acquire")
on any backend: a park, an unfenced audit append after it,
a supervisor that acquires a fence and dies, a legitimate resume that still wins (by
retrying with the token the store returns), a rival resumer that is refused because the
park is already answered, and a zombie writer fenced out.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from loom_core.errors import LoomError, StaleFenceError
from loom_core.events import Event, NewEvent
from loom_core.kinds import EventKind
from loom_core.plugins import open_storage
from loom_core.protocols import FenceAcquired, FenceStale

__all__ = ["DemoFailedError", "run_demo"]


class DemoFailedError(LoomError):
    """The store under the demo did not behave as the contract requires."""


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise DemoFailedError(f"contract violated: {what}")


async def run_demo(url: str = "memory://", *, say: Callable[[str], None] = print) -> list[Event]:
    """Run the scenario against ``url`` and return the execution's final log."""
    execution = f"order-{uuid.uuid4().hex[:8]}"
    async with open_storage(url) as storage:
        events = storage.events
        say(f"storage: {url}  capabilities: {', '.join(sorted(events.capabilities))}")
        say(f"execution {execution}")

        runner = await events.acquire_fence(execution)
        await events.append(
            execution,
            [
                NewEvent(EventKind.EXECUTION_STARTED, {"order": 42}),
                NewEvent(EventKind.STEP_COMPLETED, {"step": "charge", "result": "ok"}),
                NewEvent(EventKind.EXECUTION_SUSPENDED, {"waiting_for": "shipment"}),
            ],
            expected_sequence=0,
            fence=runner,
        )
        park_seq, park_fence = 2, runner
        say(f"  node A (fence {runner}) ran a step and parked at sequence {park_seq}")

        await events.append(
            execution,
            [NewEvent(EventKind.EXECUTION_DENIED, {"who": "mallory"})],
            expected_sequence=3,
        )
        say("  an unfenced EXECUTION_DENIED audit event landed after the park")

        dead = await events.acquire_fence(execution)
        say(f"  supervisor X acquired fence {dead} and crashed before appending")

        result = await events.acquire_fence_if(execution, fence=park_fence, park_seq=park_seq)
        _expect(isinstance(result, FenceStale), "the dead acquirer's token should make B stale")
        say(f"  resumer B: acquire_fence_if(fence={park_fence}) -> stale, current {result.fence}")
        parked = await events.read(execution, from_sequence=park_seq + 1)
        _expect(
            not any(e.kind == EventKind.EXECUTION_RESUMED for e in parked),
            "the park should still be unanswered",
        )
        result = await events.acquire_fence_if(execution, fence=result.fence, park_seq=park_seq)
        _expect(isinstance(result, FenceAcquired), "B's retry should acquire")
        resumer = result.fence
        head = await events.head(execution)
        await events.append(
            execution,
            [NewEvent(EventKind.EXECUTION_RESUMED, {"shipment": "arrived"})],
            expected_sequence=head,
            fence=resumer,
        )
        say(f"  resumer B: park still unanswered, retried -> fence {resumer}, resumed")

        rival = await events.acquire_fence_if(execution, fence=resumer, park_seq=park_seq)
        _expect(isinstance(rival, FenceStale), "C should be stale: the park is answered")
        say(f"  rival C: acquire_fence_if(fence={resumer}) -> stale: the park is answered, "
            "so B's running body is not fenced out")

        try:
            await events.append(
                execution,
                [NewEvent(EventKind.STEP_COMPLETED, {"step": "late"})],
                expected_sequence=head + 1,
                fence=runner,
            )
        except StaleFenceError as exc:
            say(f"  zombie A refused: {exc}")
        else:
            _expect(False, "the zombie's append should have been refused")

        await events.append(
            execution,
            [NewEvent(EventKind.EXECUTION_COMPLETED, {"status": "shipped"})],
            expected_sequence=head + 1,
            fence=resumer,
        )
        log = list(await events.read(execution))
        say("  final log:")
        for event in log:
            say(f"    {event.sequence:>2}  fence {event.fence}  {event.kind:<20} "
                f"{event.payload}")
        return log
