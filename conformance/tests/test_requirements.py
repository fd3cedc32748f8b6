"""The requirement switches: what they require and the reason a skipped test gives."""

from typing import Any

import pytest
from loom_conformance import requires
from loom_conformance.requirements import REFUSAL_TEST, Requirements, missing

from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS


def test_there_is_one_documented_switch_per_optional_method() -> None:
    for method in OPTIONAL_EVENT_STORE_METHODS:
        switch = getattr(Requirements, method)
        assert switch.__doc__, method
        mark = getattr(requires, method).mark
        assert mark.name == "loom_requires"
        assert mark.args == (method,)


def test_a_missing_method_explains_itself_and_names_the_refusal_test() -> None:
    reason = missing(frozenset({"subscribe"}), ("subscribe", "append_many"), ())
    assert reason is not None
    assert "append_many" in reason
    assert "subscribe" not in reason.split(";")[0]
    assert REFUSAL_TEST in reason


def test_a_skip_reason_names_the_suite_whose_refusal_test_checks_the_method() -> None:
    # A run of the runtime suite alone has no refusal test: the reason must not say it ran.
    for reason in (
        missing(frozenset(), ("subscribe",), ()),
        missing(frozenset(), (), (("acquire_fence", "acquire_fence_if"),)),
    ):
        assert reason is not None
        assert f"TestEventStoreContract's {REFUSAL_TEST} checks" in reason
        assert "checked" not in reason


def test_any_of_is_satisfied_by_one_method() -> None:
    group = (("acquire_fence", "acquire_fence_if"),)
    assert missing(frozenset({"acquire_fence_if"}), (), group) is None
    reason = missing(frozenset(), (), group)
    assert reason is not None
    assert "none of acquire_fence, acquire_fence_if" in reason


def test_an_unknown_method_name_is_a_mistake_not_a_skip() -> None:
    with pytest.raises(ValueError, match="acquire_lock"):
        missing(frozenset(), ("acquire_lock",), ())


@pytest.mark.asyncio
async def test_the_kits_optional_caller_refuses_a_name_it_does_not_know() -> None:
    from loom_conformance.suites.events_required import _call_optional

    from loom_core.memory import MemoryEventStore

    bogus: Any = "acquire_fence_eventually"
    with pytest.raises(ValueError, match="does not know"):
        await _call_optional(MemoryEventStore(), bogus, "exec-1")
