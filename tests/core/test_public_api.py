"""The exported names and the shape of the error tree are part of the API."""

import loom_core
from loom_core import errors

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
    "ANSWERING_KINDS",
    "AppendRequest",
    "BackendFactory",
    "BackendRegistry",
    "CLASSIFICATION",
    "Classification",
    "ConditionalFence",
    "ConflictError",
    "Decision",
    "Decisions",
    "DecoratorDefinitionError",
    "DecoratorRegistry",
    "DecoratorSpec",
    "DuplicateRegistrationError",
    "Event",
    "EventKind",
    "EventStore",
    "EventStoreDecorator",
    "ExecutionAlreadyExistsError",
    "ExecutionNotFoundError",
    "FORWARD",
    "FenceAcquired",
    "FenceNotIssuedError",
    "FenceStale",
    "Forward",
    "Implement",
    "InnerOpener",
    "InvalidEventError",
    "InvalidExecutionIdError",
    "InvalidInputError",
    "InvalidOptionError",
    "InvalidSequenceError",
    "InvalidURLError",
    "LayerBelowFanOutError",
    "JsonObject",
    "JsonValue",
    "KERNEL_KINDS",
    "Lease",
    "LeaseError",
    "LeaseHeldError",
    "LeaseNotHeldError",
    "LeaseScope",
    "LeaseStore",
    "LoomError",
    "NewEvent",
    "OPTIONAL_EVENT_STORE_METHODS",
    "OptionalMethod",
    "PayloadShreddedError",
    "PluginError",
    "PluginHost",
    "PluginLoadError",
    "Redrive",
    "Refuse",
    "RefusesUnoffered",
    "SequenceConflictError",
    "StaleFenceError",
    "Storage",
    "StorageDecorator",
    "StorageError",
    "StorageReadError",
    "StorageUnavailableError",
    "StorageWriteError",
    "StoreClosedError",
    "TimerRecord",
    "TimerStore",
    "UnclassifiedKindError",
    "UnknownSchemeError",
    "Unsupported",
    "WriteOutcomeUnknownError",
    "__version__",
    "base_stores",
    "default_plugins",
    "find_layer",
    "find_layers",
    "hookimpl",
    "is_answering",
    "is_answering_kind",
    "open_storage",
})
"""The public API, pinned: adding or removing a name is a decision this test makes visible."""


def test_the_public_api_is_exactly_the_pinned_names() -> None:
    assert len(set(loom_core.__all__)) == len(loom_core.__all__), "a name exported twice"
    added = set(loom_core.__all__) - EXPORTED
    removed = EXPORTED - set(loom_core.__all__)
    assert not added, f"newly exported (pin them here if meant): {sorted(added)}"
    assert not removed, f"no longer exported (a breaking change): {sorted(removed)}"


def test_star_import_gives_exactly_all_and_every_name_exists() -> None:
    namespace: dict[str, object] = {}
    exec("from loom_core import *", namespace)  # the star import is what is tested
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(loom_core.__all__)
    public = {n for n in vars(loom_core) if not n.startswith("_")}
    submodules = {n for n in public if type(getattr(loom_core, n)).__name__ == "module"}
    assert public - submodules - set(loom_core.__all__) == set(), "public names outside __all__"


def test_error_tree_refines_the_builtins_it_names() -> None:
    for name, bases in EXPECTED_ERRORS.items():
        cls = getattr(loom_core, name)
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
