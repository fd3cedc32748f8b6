"""A log is data: a name written into it by someone with write access to the database is
looked up among the app's registered workflows, never imported or called."""

from __future__ import annotations

import sys

import pytest
from loom_runtime import Context, Loom, WorkflowNotFoundError
from loom_runtime.testing import VirtualClock

from loom_core import EventKind, NewEvent, open_storage

PROBE = "loom_probe_module_never_imported"


@pytest.mark.parametrize(
    "forged", ["os:system", "os.system", "builtins.eval", f"{PROBE}:run", f"{PROBE}.run"]
)
async def test_a_workflow_name_forged_into_the_log_is_not_found_and_nothing_is_imported(
    forged: str,
) -> None:
    async with open_storage("memory://") as storage:
        app = Loom(storage, node="n", recover=False, clock=VirtualClock())

        @app.workflow(name="sleeper")
        async def sleeper(ctx: Context) -> None:
            await ctx.sleep(60)

        async with app:
            await app.start(sleeper, id="s")
            await app.drain()
            genuine = await storage.events.read("s")
            # The same log under another id, its workflow name rewritten, as a row UPDATE
            # by someone who can write the database would leave it.
            rows = [
                NewEvent(e.kind, e.payload, {k: v for k, v in e.metadata.items() if k != "fence"})
                for e in genuine
            ]
            started = rows[0]
            assert started.kind == EventKind.EXECUTION_STARTED
            assert isinstance(started.payload, dict)
            rows[0] = NewEvent(
                started.kind, {**started.payload, "workflow": forged}, started.metadata
            )
            await storage.events.append("t", rows, expected_sequence=0, fence=0)
            park = next(e for e in genuine if e.kind == EventKind.EXECUTION_SUSPENDED)
            before = await storage.events.read("t")

            with pytest.raises(WorkflowNotFoundError, match="sleeper") as caught:
                await app.resume("t", fence_if_parked_at=park.sequence)

        assert repr(forged) in str(caught.value)
        assert PROBE not in sys.modules
        assert await storage.events.read("t") == before
