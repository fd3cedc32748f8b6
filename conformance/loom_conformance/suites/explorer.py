"""The schedule explorer as contract tests (see docs/design.md, "The conditional acquire")."""

from __future__ import annotations

from typing import Literal

from loom_conformance.explorer import DEFAULT_MAX_STEPS, explore
from loom_conformance.factory import StorageFactory
from loom_conformance.requirements import requires
from loom_core import Storage

__all__ = ["ScheduleExplorerContract"]

EXPECTED_SCHEDULES = 2 ** (DEFAULT_MAX_STEPS + 1) - 1  # every word over {A, B}, length 0..10


class ScheduleExplorerContract:
    """Two resumers with crashes, every interleaving up to 10 steps (2,047 schedules).

    ``loom_storage`` is requested only so the requirement marks are checked against the
    store under test; the explorer opens its own stores from ``loom_storage_factory``.
    """

    @requires.acquire_fence_if
    async def test_explorer_conditional_acquire_has_no_violation_in_any_schedule(
        self,
        loom_storage: Storage,
        loom_storage_factory: StorageFactory,
        loom_explorer_isolation: Literal["store", "execution"],
    ) -> None:
        report = await explore(loom_storage_factory, isolation=loom_explorer_isolation)
        assert report.schedules == EXPECTED_SCHEDULES
        assert report.violations == (), "\n\n".join(v.explain() for v in report.violations[:3])
        # Not vacuous: resumes landed, and the retry with the returned token was taken.
        assert report.resumed > 0
        assert report.retried > 0

    @requires.acquire_fence
    async def test_explorer_negative_control_unconditional_acquire_fences_a_winner_out(
        self,
        loom_storage: Storage,
        loom_storage_factory: StorageFactory,
        loom_explorer_isolation: Literal["store", "execution"],
    ) -> None:
        report = await explore(
            loom_storage_factory, acquire="acquire_fence", isolation=loom_explorer_isolation
        )
        assert report.schedules == EXPECTED_SCHEDULES
        assert len(report.violations) >= 1, (
            f"with the unconditional acquire_fence, none of {report.schedules} schedules "
            "fenced out a resumer whose EXECUTION_RESUMED had landed: a rival's acquire_fence "
            "must move the token so that the earlier holder's next fenced append is refused "
            "with StaleFenceError. This store accepted every such append: its acquire_fence "
            "does not move the token its fenced appends are checked against"
        )
        assert "fenced out" in report.violations[0].rule
