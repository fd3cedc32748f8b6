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


def test_every_exported_name_exists_and_nothing_else_is_exported_by_star() -> None:
    for name in loom_core.__all__:
        assert hasattr(loom_core, name), name
    assert len(set(loom_core.__all__)) == len(loom_core.__all__)


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
