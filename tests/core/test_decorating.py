"""The decorator base: every optional method decided, checked at class definition."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from loom_core import AppendRequest, Event, EventStore, NewEvent, Unsupported
from loom_core.decorating import (
    FORWARD,
    Decisions,
    DecoratorDefinitionError,
    EventStoreDecorator,
    Implement,
    Refuse,
)
from loom_core.memory import MemoryEventStore
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS

ALL_FORWARD = Decisions(
    acquire_fence=FORWARD,
    acquire_fence_if=FORWARD,
    append_if_unchanged=FORWARD,
    append_many=FORWARD,
    delete_execution=FORWARD,
    copy_prefix=FORWARD,
    truncate_prefix_keeping=FORWARD,
    subscribe=FORWARD,
)


class Passthrough(EventStoreDecorator):
    decisions = ALL_FORWARD


class Counting(EventStoreDecorator):
    calls = 0

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        type(self).calls += 1
        return await self.inner.append_many(requests)

    async def acquire_fence(self, execution_id: str) -> int:
        return 99

    decisions = Decisions(
        acquire_fence=Implement(acquire_fence, requires=()),
        acquire_fence_if=FORWARD,
        append_if_unchanged=FORWARD,
        append_many=Implement(append_many),
        delete_execution=Refuse("counting stores keep every log"),
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=Refuse("no live reads here"),
    )


def test_forwarded_capabilities_follow_the_inner_store() -> None:
    full = Passthrough(MemoryEventStore())
    bare = Passthrough(MemoryEventStore(offer=()))
    assert full.capabilities == set(OPTIONAL_EVENT_STORE_METHODS)
    assert bare.capabilities == frozenset()


async def test_forward_over_an_inner_store_that_lacks_the_method_raises_unsupported() -> None:
    bare = Passthrough(MemoryEventStore(offer=()))
    with pytest.raises(Unsupported, match="does not offer acquire_fence"):
        await bare.acquire_fence("e")


def test_decisions_shape_capabilities_over_full_and_bare_inners() -> None:
    full = Counting(MemoryEventStore())
    bare = Counting(MemoryEventStore(offer=()))
    expected_full = set(OPTIONAL_EVENT_STORE_METHODS) - {"delete_execution", "subscribe"}
    assert full.capabilities == expected_full
    # implemented with requires=(): offered even when the inner lacks everything
    assert bare.capabilities == {"acquire_fence"}


def test_implement_by_default_requires_the_method_of_its_own_name() -> None:
    class Plain(EventStoreDecorator):
        async def delete_execution(self, execution_id: str) -> bool:
            return await self.inner.delete_execution(execution_id)

        decisions = Decisions(
            acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
            append_many=FORWARD, delete_execution=Implement(delete_execution),
            copy_prefix=FORWARD, truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
        )

    assert "delete_execution" in Plain(MemoryEventStore()).capabilities
    assert "delete_execution" not in Plain(MemoryEventStore(offer=())).capabilities
    assert Implement(Plain.delete_execution).needs("delete_execution") == {"delete_execution"}
    assert Implement(Plain.delete_execution, requires=()).needs("x") == frozenset()


async def test_refused_method_raises_unsupported_with_the_reason() -> None:
    store = Counting(MemoryEventStore())
    with pytest.raises(Unsupported, match="counting stores keep every log"):
        await store.delete_execution("e")
    with pytest.raises(Unsupported, match="no live reads"):
        store.subscribe("e")


async def test_implemented_method_runs_the_decorators_code() -> None:
    store = Counting(MemoryEventStore())
    assert await store.acquire_fence("e") == 99
    before = Counting.calls
    await store.append_many([AppendRequest("e", [NewEvent("k")], 0)])
    assert Counting.calls == before + 1
    assert len(await store.read("e")) == 1


async def test_implemented_method_with_unmet_requirement_is_unsupported() -> None:
    store = Counting(MemoryEventStore(offer=()))
    with pytest.raises(Unsupported, match="does not offer append_many"):
        await store.append_many([AppendRequest("e", [NewEvent("k")], 0)])


def test_undecided_method_fails_at_class_definition() -> None:
    partial = {k: v for k, v in ALL_FORWARD.items() if k != "subscribe"}
    with pytest.raises(DecoratorDefinitionError, match="does not decide \\['subscribe'\\]"):
        type("Undecided", (EventStoreDecorator,), {"decisions": partial})


def test_unknown_method_fails_at_class_definition() -> None:
    extra = {**ALL_FORWARD, "teleport": FORWARD}
    with pytest.raises(DecoratorDefinitionError, match="unknown method"):
        type("Unknown", (EventStoreDecorator,), {"decisions": extra})


def test_implement_naming_no_method_of_the_class_fails() -> None:
    async def elsewhere(self: object, execution_id: str) -> int:
        return 1

    decisions = {**ALL_FORWARD, "acquire_fence": Implement(elsewhere)}
    with pytest.raises(DecoratorDefinitionError, match="own acquire_fence"):
        type("Stray", (EventStoreDecorator,), {"decisions": decisions})


def test_forward_while_defining_the_method_fails() -> None:
    async def acquire_fence(self: object, execution_id: str) -> int:
        return 1

    with pytest.raises(DecoratorDefinitionError, match="FORWARD but defines"):
        type(
            "Confused",
            (EventStoreDecorator,),
            {"decisions": ALL_FORWARD, "acquire_fence": acquire_fence},
        )


def test_refuse_without_a_reason_fails() -> None:
    mute = {**ALL_FORWARD, "subscribe": Refuse("")}
    with pytest.raises(DecoratorDefinitionError, match="needs a reason"):
        type("Mute", (EventStoreDecorator,), {"decisions": mute})


def test_decisions_are_never_inherited_silently() -> None:
    with pytest.raises(DecoratorDefinitionError, match="decisions are never inherited"):

        class Child(Passthrough):
            pass


def test_an_abstract_intermediate_base_may_defer_its_decisions() -> None:
    class Base(EventStoreDecorator, abstract=True):
        pass

    class Concrete(Base):
        decisions = ALL_FORWARD

    assert Concrete(MemoryEventStore()).capabilities == set(OPTIONAL_EVENT_STORE_METHODS)


MYPY_CASES = {
    "undecided": (
        """
        decisions = Decisions(
            acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
            append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
            truncate_prefix_keeping=FORWARD,
        )
        """,
        'Missing key "subscribe"',
    ),
    "unknown": (
        """
        decisions: Decisions = {
            "acquire_fence": FORWARD, "acquire_fence_if": FORWARD,
            "append_if_unchanged": FORWARD, "append_many": FORWARD,
            "delete_execution": FORWARD, "copy_prefix": FORWARD,
            "truncate_prefix_keeping": FORWARD, "subscribe": FORWARD, "teleport": FORWARD,
        }
        """,
        '"teleport"',
    ),
    "implement_without_method": (
        """
        decisions = Decisions(
            acquire_fence=Implement(), acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
            append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
            truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
        )
        """,
        'Missing positional argument "method"',
    ),
}


@pytest.mark.parametrize("case", sorted(MYPY_CASES))
def test_a_malformed_decision_is_a_mypy_error(case: str, tmp_path: Path) -> None:
    body, expected = MYPY_CASES[case]
    source = tmp_path / f"bad_{case}.py"
    source.write_text(
        "from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Implement\n\n"
        "class Bad(EventStoreDecorator):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert expected in result.stdout, result.stdout


def test_a_complete_decorator_is_mypy_clean(tmp_path: Path) -> None:
    source = tmp_path / "good.py"
    source.write_text(
        "from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Refuse\n\n"
        "class Good(EventStoreDecorator):\n"
        "    decisions = Decisions(\n"
        "        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,\n"
        "        append_many=FORWARD, delete_execution=Refuse('never'), copy_prefix=FORWARD,\n"
        "        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,\n"
        "    )\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def test_find_layer_walks_the_stack_from_a_storage_or_a_store() -> None:
    from loom_core import Storage
    from loom_core.decorating import find_layer
    from loom_core.memory import MemoryLeaseStore, MemoryTimerStore

    base = MemoryEventStore()
    stack = Passthrough(Counting(base))
    storage = Storage(stack, MemoryTimerStore(), MemoryLeaseStore())
    assert find_layer(storage, Counting) is stack.inner
    assert find_layer(stack, Passthrough) is stack
    assert find_layer(base, Counting) is None


class FanOut(EventStoreDecorator):
    """A test fan-out: wraps several stores, and says so through ``wrapped``."""

    def __init__(self, branches: Sequence[EventStore]) -> None:
        super().__init__(branches[0])
        self.branches = tuple(branches)

    @property
    def wrapped(self) -> tuple[EventStore, ...]:
        return self.branches

    decisions = ALL_FORWARD


def test_a_decorator_over_one_store_wraps_exactly_that_store() -> None:
    base = MemoryEventStore()
    stack = Passthrough(base)
    assert stack.wrapped == (base,)
    assert stack.inner is base


def test_base_stores_are_every_store_at_the_bottom_of_the_stack_in_order() -> None:
    from loom_core.decorating import base_stores

    first, second, third = MemoryEventStore(), MemoryEventStore(), MemoryEventStore()
    stack = Passthrough(FanOut([Counting(first), FanOut([second, third])]))
    assert base_stores(stack) == (first, second, third)
    assert base_stores(first) == (first,)
    shared = FanOut([Passthrough(first), Counting(first)])  # one store reached twice
    assert base_stores(shared) == (first,)


async def test_find_layers_finds_the_layer_on_every_branch_of_a_fan_out() -> None:
    from loom_core import Storage
    from loom_core.decorating import find_layers
    from loom_core.memory import MemoryLeaseStore, MemoryTimerStore

    left, right = Counting(MemoryEventStore()), Counting(MemoryEventStore())
    fan = FanOut([Passthrough(left), right, MemoryEventStore()])
    storage = Storage(Passthrough(fan), MemoryTimerStore(), MemoryLeaseStore())
    assert find_layers(storage, Counting) == (left, right)
    assert find_layers(fan, FanOut) == (fan,)  # the outermost of a kind, not what it wraps
    assert find_layers(MemoryEventStore(), Counting) == ()


def test_find_layer_above_a_fan_out_is_the_one_every_call_passes() -> None:
    from loom_core.decorating import find_layer

    counting = Counting(FanOut([MemoryEventStore(), MemoryEventStore()]))
    assert find_layer(Passthrough(counting), Counting) is counting
    assert find_layer(counting, Passthrough) is None


def test_find_layer_below_a_fan_out_is_refused_not_guessed() -> None:
    from loom_core import InvalidOptionError
    from loom_core.decorating import LayerBelowFanOutError, find_layer

    on_shard_0 = Counting(MemoryEventStore())
    fan = FanOut([on_shard_0, MemoryEventStore(), Counting(MemoryEventStore())])
    with pytest.raises(LayerBelowFanOutError) as caught:
        find_layer(Passthrough(fan), Counting)
    assert isinstance(caught.value, InvalidOptionError)
    assert caught.value.fan_out is fan
    assert caught.value.found == (on_shard_0, fan.branches[2])
    assert "find_layers" in str(caught.value)
    assert "3 stores" in str(caught.value)


async def test_a_fan_out_offers_a_forwarded_method_only_when_every_branch_does() -> None:
    fan = FanOut([MemoryEventStore(), MemoryEventStore(offer=("acquire_fence",))])
    assert fan.capabilities == {"acquire_fence"}
    with pytest.raises(Unsupported, match="not every one of the 2 stores it wraps"):
        await fan.append_many([AppendRequest("e", [NewEvent("A")], 0)])
