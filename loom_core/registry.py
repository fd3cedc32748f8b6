"""Registries the plugin hooks fill: URL scheme → backend factory, name → decorator."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeAlias, runtime_checkable

from typing_extensions import get_protocol_members

from loom_core.errors import DuplicateRegistrationError, InvalidOptionError
from loom_core.storage import Storage

__all__ = [
    "BackendFactory",
    "BackendRegistry",
    "DecoratorRegistry",
    "InnerOpener",
    "StorageDecorator",
]

BackendFactory: TypeAlias = Callable[[str, Mapping[str, object]], Awaitable[Storage]]
"""``factory(url, options)`` opens a :class:`Storage` for ``url``; it validates ``options``
and raises :class:`~loom_core.errors.InvalidOptionError` for any it does not know."""

InnerOpener: TypeAlias = Callable[[], Awaitable[Storage]]
"""Opens one more fresh, empty storage of the kind under test (the conformance kit)."""

_NAME = re.compile(r"^[a-z][a-z0-9+.-]*$")


@runtime_checkable
class StorageDecorator(Protocol):
    """A decorator plugin: wraps a whole :class:`Storage` (events, timers and leases)."""

    @property
    def name(self) -> str: ...

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        """Return ``storage`` wrapped; closing the result closes ``storage``."""
        ...

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        """Options that let the conformance kit build this decorator over any store
        (``open_inner`` opens more stores of the same kind, e.g. extra shards)."""
        ...


class _Registry:
    _kind = "name"

    def __init__(self) -> None:
        self._source = "in-process"
        self._owners: dict[str, str] = {}
        self.conflicts: dict[str, DuplicateRegistrationError] = {}

    def _claim(self, name: object) -> str:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidOptionError(
                f"{self._kind} {name!r} must be lowercase letters, digits, '+', '.', '-'"
            )
        first = self._owners.get(name)
        if first is not None:
            error = DuplicateRegistrationError(self._kind, name, first, self._source)
            self.conflicts[name] = error
            raise error
        self._owners[name] = self._source
        return name

    def source_of(self, name: str) -> str | None:
        return self._owners.get(name)


class BackendRegistry(_Registry):
    """URL scheme → factory. A scheme registered twice is refused, naming both sources."""

    _kind = "backend scheme"

    def __init__(self) -> None:
        super().__init__()
        self.factories: dict[str, BackendFactory] = {}

    def add_backend(self, scheme: str, factory: BackendFactory) -> None:
        if not callable(factory):
            raise InvalidOptionError(f"backend factory for {scheme!r} is not callable")
        self.factories[self._claim(scheme)] = factory


class DecoratorRegistry(_Registry):
    """Decorator name → decorator. A name registered twice is refused, naming both."""

    _kind = "decorator"

    def __init__(self) -> None:
        super().__init__()
        self.decorators: dict[str, StorageDecorator] = {}

    def add_decorator(self, decorator: StorageDecorator) -> None:
        # hasattr, not isinstance: from Python 3.12 on, isinstance() of a protocol looks
        # attributes up statically, and so refuses a decorator that forwards what it does
        # not define itself through __getattr__, which it accepted before.
        lacking = sorted(
            m for m in get_protocol_members(StorageDecorator) if not hasattr(decorator, m)
        )
        if lacking:
            raise InvalidOptionError(
                f"{decorator!r} is not a StorageDecorator (needs name, decorate, "
                f"conformance_options; lacks {', '.join(lacking)})"
            )
        self.decorators[self._claim(decorator.name)] = decorator
