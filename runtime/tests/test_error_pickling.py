"""Every LoomError, the kernel's and the runtime's, crosses a process: pickled and copied,
it comes back as the same class with the same message and fields, though most take other
arguments than the message they hold."""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from loom_runtime.errors import ContextOutsideBodyError

from loom_core.decorating import LayerBelowFanOutError
from loom_core.errors import LoomError

# Errors whose arguments the sample maker below cannot guess.
_MADE_BY_HAND: dict[type[LoomError], LoomError] = {
    ContextOutsideBodyError: ContextOutsideBodyError("step"),
}
_LEFT_OUT = {LayerBelowFanOutError}  # holds live store objects: never sent anywhere


def _subclasses(cls: type[LoomError]) -> Iterator[type[LoomError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _sample(cls: type[LoomError]) -> LoomError:
    """One of ``cls``, made with a plausible value for each required argument."""
    if cls in _MADE_BY_HAND:
        return _MADE_BY_HAND[cls]
    values: dict[str, object] = {}
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is not parameter.empty:
            continue
        annotation = str(parameter.annotation)
        if annotation == "int":
            values[parameter.name] = 3
        elif annotation == "float":
            values[parameter.name] = 1.5
        elif "BaseException" in annotation:
            values[parameter.name] = ValueError("the cause")
        elif "datetime" in annotation:
            values[parameter.name] = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        else:
            values[parameter.name] = "order-42"
    if not values and cls.__init__ is BaseException.__init__:
        return cls("what went wrong")
    return cls(**values)


_CLASSES = sorted(
    {
        cls
        for cls in _subclasses(LoomError)
        if cls.__module__.startswith(("loom_core.", "loom_runtime."))
    }
    - _LEFT_OUT,
    key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
)


def _fields(error: BaseException) -> dict[str, str]:
    return {name: repr(value) for name, value in vars(error).items()}


def test_the_tree_is_walked() -> None:
    """The walk finds the errors that take other arguments than a message (it is not
    vacuous)."""
    names = {cls.__name__ for cls in _CLASSES}
    assert {"StepFailedError", "InvalidExecutionIdError", "StaleFenceError"} <= names
    assert len(_CLASSES) > 40


@pytest.mark.parametrize("cls", _CLASSES, ids=lambda cls: cls.__name__)
def test_an_error_pickles_and_copies_with_its_fields(cls: type[LoomError]) -> None:
    error = _sample(cls)
    error.add_note("a note a caller added")
    for again in (
        pickle.loads(pickle.dumps(error)),
        copy.copy(error),
        copy.deepcopy(error),
    ):
        assert type(again) is cls
        assert str(again) == str(error)
        assert again.args == error.args
        assert _fields(again) == _fields(error)
        assert again.__notes__ == ["a note a caller added"]
