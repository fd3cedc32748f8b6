"""One documented switch per optional capability (after SQLAlchemy's ``requirements.py``).

A contract test of an optional method is marked with the switch for it; the kit's
``loom_storage`` fixture opens the store, reads ``capabilities`` and skips the test where the
method is not offered, with a reason that says so and names the refusal test that ran in
its place. So every optional method is either exercised (offered) or checked to raise
:class:`~loom_core.Unsupported` (not offered), and the skip reasons tell a store author
exactly which of the two happened::

    from loom_conformance.requirements import requires

    @requires.acquire_fence_if
    async def test_something(self, loom_events): ...

A store does not configure these switches: it declares what it offers through
``capabilities``, and the switches follow it.
"""

from __future__ import annotations

from typing import Final, final

import pytest

from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, OptionalMethod

__all__ = [
    "COVERAGE_PROPERTY",
    "REFUSAL_TEST",
    "REQUIRES_ANY_MARK",
    "REQUIRES_MARK",
    "Requirements",
    "requires",
]

REQUIRES_MARK: Final = "loom_requires"
"""``@pytest.mark.loom_requires("m1", "m2")``: runs only where every named method is offered."""

REQUIRES_ANY_MARK: Final = "loom_requires_any"
"""``@pytest.mark.loom_requires_any("m1", "m2")``: runs where at least one is offered."""

REFUSAL_TEST: Final = "test_optional_method_is_offered_or_refused_with_unsupported"
"""The test that checks, for every optional method, the branch the store chose."""

COVERAGE_PROPERTY: Final = "loom_optional_method"
"""The ``user_properties`` entry :data:`REFUSAL_TEST` records: ``(method, offered)``."""


def _requires(*methods: OptionalMethod) -> pytest.MarkDecorator:
    return pytest.mark.loom_requires(*methods)


@final
class Requirements:
    """The switches. Each property is a pytest mark for one optional method."""

    __slots__ = ()

    @property
    def acquire_fence(self) -> pytest.MarkDecorator:
        """``acquire_fence(id)``: the unconditional bump (old + 1). Without it the store
        cannot take an execution from a writer; the negative control of the schedule
        explorer needs it."""
        return _requires("acquire_fence")

    @property
    def acquire_fence_if(self) -> pytest.MarkDecorator:
        """``acquire_fence_if(id, fence=, park_seq=)``: the conditional acquire
        (docs/design.md). Its cases are the fencing contract and the schedule explorer."""
        return _requires("acquire_fence_if")

    @property
    def append_if_unchanged(self) -> pytest.MarkDecorator:
        """``append_if_unchanged``: an append guarded by an observed token, stamping and
        bumping nothing."""
        return _requires("append_if_unchanged")

    @property
    def append_many(self) -> pytest.MarkDecorator:
        """``append_many``: several executions' appends, all or nothing."""
        return _requires("append_many")

    @property
    def delete_execution(self) -> pytest.MarkDecorator:
        """``delete_execution``: drops a log and moves its fence token one on."""
        return _requires("delete_execution")

    @property
    def copy_prefix(self) -> pytest.MarkDecorator:
        """``copy_prefix``: branching a log into a new execution."""
        return _requires("copy_prefix")

    @property
    def truncate_prefix_keeping(self) -> pytest.MarkDecorator:
        """``truncate_prefix_keeping``: compaction that keeps the head."""
        return _requires("truncate_prefix_keeping")

    @property
    def subscribe(self) -> pytest.MarkDecorator:
        """``subscribe``: existing events, then live ones."""
        return _requires("subscribe")

    @property
    def fencing(self) -> pytest.MarkDecorator:
        """Either acquire method: the tests of ``StaleFenceError`` need *some* way to give
        an execution a token above 0, and either method can."""
        return pytest.mark.loom_requires_any("acquire_fence", "acquire_fence_if")


requires: Final = Requirements()
"""The kit's switches (``@requires.subscribe``)."""


def missing(
    offered: frozenset[OptionalMethod],
    all_of: tuple[str, ...],
    any_of: tuple[tuple[str, ...], ...],
) -> str | None:
    """Why a test with these marks cannot run on a store offering ``offered``, or None."""
    known = set(OPTIONAL_EVENT_STORE_METHODS)
    absent = [m for m in all_of if m not in offered]
    unknown = [m for m in (*all_of, *(m for group in any_of for m in group)) if m not in known]
    if unknown:
        raise ValueError(f"loom_requires names unknown optional methods {unknown}")
    # The refusal test is TestEventStoreContract's: a run of another suite alone (the
    # runtime's, say) skips here without it, so the reason says where it lives rather
    # than claim it ran.
    if absent:
        return (
            f"the store does not offer {', '.join(absent)} (absent from capabilities); "
            f"TestEventStoreContract's {REFUSAL_TEST} checks that calling it raises "
            "Unsupported"
        )
    for group in any_of:
        if not any(m in offered for m in group):
            return (
                f"the store offers none of {', '.join(group)} (absent from capabilities); "
                f"TestEventStoreContract's {REFUSAL_TEST} checks that each raises Unsupported"
            )
    return None
