"""The digest of a workflow's code that its log records (EXECUTION_STARTED's and
EXECUTION_RECOVERED's ``fingerprint``): which code began a run, or took it over.

It covers the body and the functions it names that live in its own package (the
top-level package of its module: a helper coroutine, a step function), and theirs in
turn. A method reached through an object, or a function of another package, is not
covered. The same code gives the same digest in every process that runs it.

What it is for (docs/design.md, "Replay and positions" and "Recovery"): a park is
answered without replaying the log first only under the code that wrote it, and a
recovery limit counts the takeovers of one code in a row. A digest that changes when
nothing that matters did costs a replay that appends nothing; one that stays the same
when a helper's calls changed lets a park be answered before the run meets the change.
"""

from __future__ import annotations

import functools
import hashlib
import types
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Final

__all__ = ["code_digest"]

MAX_FUNCTIONS: Final = 256
"""How many functions one digest reads at most (the body first, then breadth first):
a bound on the work, not a limit anyone should reach."""


def code_digest(fn: Callable[..., Any]) -> str:
    """A short digest of ``fn``'s code and of the functions of its package it reaches by
    name. Take it once the modules are imported, not while ``fn`` is being decorated: a
    helper defined below the workflow is not yet bound then."""
    digest = hashlib.sha256()
    root = _function(fn)
    if root is None:
        digest.update(getattr(fn, "__qualname__", repr(fn)).encode())
        return digest.hexdigest()[:16]
    home = _package(root)
    queue = deque([root])
    seen = {root.__code__}
    read = 0
    while queue and read < MAX_FUNCTIONS:
        function = queue.popleft()
        read += 1
        _feed(digest, function.__code__)
        for reached in _reached(function):
            if reached.__code__ not in seen and _package(reached) == home:
                seen.add(reached.__code__)
                queue.append(reached)
    return digest.hexdigest()[:16]


def _function(value: object) -> types.FunctionType | None:
    """The Python function ``value`` is, under partials and bound methods; None for
    anything else (a builtin, a class, a callable object)."""
    while isinstance(value, functools.partial):
        value = value.func
    if isinstance(value, types.MethodType):
        value = value.__func__
    return value if isinstance(value, types.FunctionType) else None


def _package(function: types.FunctionType) -> str:
    module = function.__module__ or ""
    return module.partition(".")[0]


def _reached(function: types.FunctionType) -> Iterator[types.FunctionType]:
    """The functions ``function`` names: the globals its code (nested code included)
    loads, in the order the code names them, then the functions in its closure."""
    names = function.__globals__
    for name in _names(function.__code__):
        found = _function(names.get(name))
        if found is not None:
            yield found
    for cell in function.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # a cell not yet bound
            continue
        found = _function(contents)
        if found is not None:
            yield found


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _feed(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed(digest, const)
        else:
            digest.update(_constant(const).encode())
    digest.update(repr(code.co_names).encode())


def _constant(value: object) -> str:
    """A constant's text, the same in every process: a set literal's frozenset in sorted
    order, not in its repr's, which follows string hashing and so differs per process."""
    if isinstance(value, frozenset):
        return "frozenset(" + ", ".join(sorted(map(_constant, value))) + ")"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_constant, value)) + ")"
    return repr(value)
