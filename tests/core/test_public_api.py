"""The exported names and the shape of the error tree are part of the API."""

import types
from typing import Final

import pytest

import loom_core
from loom_core import decorating, errors, memory, spi

EXPECTED_ERRORS = {
    "LoomError": (Exception,),
    "InvalidInputError": (errors.LoomError, ValueError),
    "InvalidOptionError": (errors.InvalidInputError, TypeError),
    "Unsupported": (errors.LoomError, NotImplementedError),
    "ExecutionNotFoundError": (errors.LoomError, LookupError),
    "SequenceConflictError": (errors.ConflictError,),
    "ExecutionAlreadyExistsError": (errors.ConflictError,),
    "StaleFenceError": (errors.ConflictError,),
    "StorageWriteError": (errors.StorageError,),
    "UnknownSchemeError": (errors.InvalidURLError,),
    "DecoratorDefinitionError": (errors.PluginError, TypeError),
}


EXPORTED = frozenset({
    "__version__",
    "open_storage",
    "Storage",
    "Event",
    "NewEvent",
    "JsonValue",
    "JsonObject",
    "EventKind",
    "is_answering",
    "EventStore",
    "TimerStore",
    "LeaseStore",
    "AppendRequest",
    "FenceAcquired",
    "FenceStale",
    "TimerRecord",
    "Redrive",
    "Lease",
    "LeaseScope",
    "LoomError",
    "ConflictError",
    "SequenceConflictError",
    "ExecutionAlreadyExistsError",
    "StaleFenceError",
    "FenceNotIssuedError",
    "ExecutionNotFoundError",
    "InvalidInputError",
    "InvalidEventError",
    "InvalidExecutionIdError",
    "InvalidOptionError",
    "InvalidSequenceError",
    "InvalidURLError",
    "UnknownSchemeError",
    "Unsupported",
    "StorageError",
    "StorageReadError",
    "StorageWriteError",
    "StorageUnavailableError",
    "StoreClosedError",
    "WriteOutcomeUnknownError",
    "PayloadShreddedError",
    "LeaseError",
    "LeaseHeldError",
    "LeaseNotHeldError",
    "PluginError",
    "PluginLoadError",
})
"""``loom_core``: what a user of storage needs. Adding or removing a name is a decision
this test makes visible."""

SPI_EXPORTED = frozenset({
    "EventStore",
    "TimerStore",
    "LeaseStore",
    "OPTIONAL_EVENT_STORE_METHODS",
    "OptionalMethod",
    "DEFAULT_LIST_LIMIT",
    "AppendRequest",
    "ConditionalFence",
    "FenceAcquired",
    "FenceStale",
    "TimerRecord",
    "Redrive",
    "Lease",
    "LeaseScope",
    "Event",
    "NewEvent",
    "build_event",
    "build_new_event",
    "RefusesUnoffered",
    "MAX_EVENTS_PER_APPEND",
    "MAX_ID_BYTES",
    "MAX_INT_BITS",
    "MAX_POSITION",
    "CheckedEvents",
    "canonical_json",
    "check_append",
    "check_append_requests",
    "check_aware",
    "check_batch",
    "check_events",
    "check_events_with_text",
    "check_execution_id",
    "check_fence",
    "check_key",
    "check_limit",
    "check_read",
    "check_sequence",
    "check_timer_record",
    "check_ttl",
    "json_text",
    "ANSWERING_KINDS",
    "KERNEL_KINDS",
    "CLASSIFICATION",
    "Classification",
    "is_answering_kind",
    "UnclassifiedKindError",
    "hookimpl",
    "BackendFactory",
    "BackendRegistry",
    "InnerOpener",
    "DuplicateRegistrationError",
    "PluginHost",
    "default_plugins",
})
"""``loom_core.spi``: the store author's namespace."""

DECORATING_EXPORTED = frozenset({
    "EventStoreDecorator",
    "Decisions",
    "Decision",
    "FORWARD",
    "Forward",
    "Implement",
    "Refuse",
    "RefusesUnoffered",
    "DecoratorDefinitionError",
    "CheckedEvents",
    "check_batch",
    "find_layer",
    "find_layers",
    "base_stores",
    "LayerBelowFanOutError",
    "StorageDecorator",
    "DecoratorRegistry",
    "DecoratorSpec",
    "InnerOpener",
    "hookimpl",
})
"""``loom_core.decorating``: the decorator author's namespace."""

MEMORY_EXPORTED = frozenset({
    "MemoryEventStore",
    "MemoryLeaseStore",
    "MemoryTimerStore",
    "open_memory",
})

PINNED: Final = {
    "loom_core": (loom_core, EXPORTED),
    "loom_core.spi": (spi, SPI_EXPORTED),
    "loom_core.decorating": (decorating, DECORATING_EXPORTED),
    "loom_core.memory": (memory, MEMORY_EXPORTED),
}

AUTHOR_ONLY_ERRORS: Final = frozenset({
    "DecoratorDefinitionError",
    "DuplicateRegistrationError",
    "UnclassifiedKindError",
})
"""Errors only a plugin author meets (while defining or registering a plugin, or adding a
kernel kind): exported from the author namespaces, not the user's."""


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_namespace_exports_exactly_the_pinned_names(name: str) -> None:
    module, pinned = PINNED[name]
    exported = list(module.__all__)
    assert len(set(exported)) == len(exported), f"{name}: a name exported twice"
    added = set(exported) - pinned
    removed = pinned - set(exported)
    assert not added, f"{name} newly exports (pin them here if meant): {sorted(added)}"
    assert not removed, f"{name} no longer exports (a breaking change): {sorted(removed)}"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_star_import_gives_exactly_all_and_every_name_exists(name: str) -> None:
    module, _ = PINNED[name]
    for exported in module.__all__:
        assert getattr(module, exported, None) is not None, f"{name}.{exported} does not resolve"
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)  # the star import is what is tested
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(module.__all__)
    public = {n for n in vars(module) if not n.startswith("_")}
    submodules = {n for n in public if isinstance(getattr(module, n), types.ModuleType)}
    outside = public - submodules - set(module.__all__)
    assert not outside, f"{name}: public names outside __all__: {sorted(outside)}"


def test_a_user_gets_every_error_from_the_top_level_but_the_author_only_ones() -> None:
    assert set(errors.__all__) - AUTHOR_ONLY_ERRORS <= set(loom_core.__all__)
    assert not AUTHOR_ONLY_ERRORS & set(loom_core.__all__)
    assert spi.DuplicateRegistrationError is errors.DuplicateRegistrationError
    assert decorating.DecoratorDefinitionError is errors.DecoratorDefinitionError
    assert issubclass(spi.UnclassifiedKindError, errors.LoomError)


def test_the_author_namespaces_share_the_contract_objects_of_the_top_level() -> None:
    for name in EXPORTED & SPI_EXPORTED:
        assert getattr(spi, name) is getattr(loom_core, name), name
    for name in SPI_EXPORTED & DECORATING_EXPORTED:
        assert getattr(spi, name) is getattr(decorating, name), name


def test_error_tree_refines_the_builtins_it_names() -> None:
    for name, bases in EXPECTED_ERRORS.items():
        cls = getattr(errors, name)
        for base in bases:
            assert issubclass(cls, base), (name, base)
        assert issubclass(cls, errors.LoomError) or cls is errors.LoomError


def test_every_error_in_the_module_is_drawn_in_its_docstring() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        assert name in doc, name


def test_errors_carry_the_data_a_caller_acts_on() -> None:
    stale = errors.StaleFenceError("e", 3, 5)
    assert (stale.execution_id, stale.presented_fence, stale.current_fence) == ("e", 3, 5)
    assert "must stop" in str(stale)
    conflict = errors.SequenceConflictError("e", 2, 7)
    assert conflict.actual_head == 7
    assert "retry from the actual head" in str(conflict)
    exists = errors.ExecutionAlreadyExistsError("e", 4)
    assert exists.actual_head == 4
    unsupported = errors.Unsupported("subscribe", "Store", "no live reads")
    assert unsupported.method == "subscribe"
    assert "no live reads" in str(unsupported)
