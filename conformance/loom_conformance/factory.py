"""What the kit opens stores with: :data:`StorageFactory` and the ``memory://`` factories."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeAlias

from loom_core import Storage, open_storage
from loom_core.spi import OptionalMethod

__all__ = ["StorageFactory", "memory_factory"]

StorageFactory: TypeAlias = Callable[[], Awaitable[Storage]]
"""Opens a fresh, empty :class:`~loom_core.Storage` on each call; the caller closes it.

"Fresh" matters: the contract tests assume no execution, timer or lease exists in what
they are handed (``list_executions`` starts empty), and the schedule explorer opens one
per schedule."""


def memory_factory(offer: Iterable[OptionalMethod] | None = None) -> StorageFactory:
    """A factory for ``memory://``; ``offer`` narrows the optional methods the event store
    offers (``()`` gives a store offering none, the others then raise ``Unsupported``)."""
    options: dict[str, object] = {} if offer is None else {"offer": tuple(offer)}

    async def open_memory() -> Storage:
        return await open_storage("memory://", options=options)

    return open_memory
