"""Shards of one kind of store, the router over them, and the error boundary of a call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Generic, Literal, TypeVar, final

from loom_core.errors import (
    InvalidOptionError,
    LoomError,
    StorageError,
    StorageUnavailableError,
    StoreClosedError,
)
from loom_core.spi import check_key
from loom_sharded.errors import Shard, ShardUnavailableError
from loom_sharded.routing import ShardRouter

__all__ = ["Placement", "on_shard"]

T = TypeVar("T")
R = TypeVar("R")


@final
class on_shard:  # noqa: N801 (used as a function: ``with on_shard(shard, id):``)
    """Name the shard in whatever a call to it raises.

    A shard that reports itself unreachable (``StorageUnavailableError``), or fails with an
    error that is not a Loom error at all (a driver's connection error, a closed pool), is
    down for this call: :class:`ShardUnavailableError` names it. Other storage errors keep
    their type (a ``StorageWriteError`` still means "may have landed") and gain a note
    naming the shard. Conflicts and refusals are the shard's answer and pass unchanged.

    A class rather than a generator context manager: it wraps every call to a shard, and
    costs a third as much this way.
    """

    __slots__ = ("_execution_id", "_shard")

    def __init__(self, shard: Shard, execution_id: str | None = None) -> None:
        self._shard = shard
        self._execution_id = execution_id

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if error is None or not isinstance(error, Exception):
            return False
        if isinstance(error, StorageUnavailableError):
            raise ShardUnavailableError(self._shard, self._execution_id, error) from error
        if isinstance(error, StorageError):
            error.add_note(f"raised by {self._shard}")
            return False
        if isinstance(error, LoomError):
            return False
        raise ShardUnavailableError(self._shard, self._execution_id, error) from error


class Placement(Generic[T]):
    """``stores[i]`` is shard ``i``; :meth:`route` finds the one that owns a key.

    Once :meth:`close_all` has run, every call is refused with the kernel's
    :class:`~loom_core.errors.StoreClosedError` naming ``label``: the sharded store was
    closed, which is not the same as one shard being down
    (:class:`~loom_sharded.errors.ShardUnavailableError`, for a shard closed on its own).
    """

    __slots__ = ("closed", "label", "router", "shards", "stores")

    def __init__(
        self,
        stores: Sequence[T],
        router: ShardRouter,
        shards: Sequence[Shard],
        label: str = "the sharded store",
    ) -> None:
        if not (len(stores) == len(router) == len(shards)):
            raise InvalidOptionError(
                f"{len(stores)} stores, {len(router)} shard names and {len(shards)} shards "
                "must be as many"
            )
        self.stores = tuple(stores)
        self.router = router
        self.shards = tuple(shards)
        self.label = label
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(self.label)

    def route(self, key: object, what: str = "execution id") -> tuple[str, T, Shard]:
        """The checked key, and the store and shard that own it. The key is checked before
        whether the store is open: bad input is refused as bad input, closed or not."""
        checked = check_key(key, what)
        self.check_open()
        index = self.router.owner(checked)
        return checked, self.stores[index], self.shards[index]

    def index_of(self, key: object, what: str = "execution id") -> int:
        checked = check_key(key, what)
        self.check_open()
        return self.router.owner(checked)

    async def each(self, call: Callable[[T], Awaitable[R]]) -> list[R | BaseException]:
        """``call`` on every shard concurrently; a failed shard's slot holds its error
        (a :class:`ShardUnavailableError` when the shard is down, see :func:`on_shard`)."""
        self.check_open()
        return await self._each(call)

    async def _each(self, call: Callable[[T], Awaitable[R]]) -> list[R | BaseException]:
        async def one(store: T, shard: Shard) -> R:
            with on_shard(shard):
                return await call(store)

        return await asyncio.gather(
            *(one(store, shard) for store, shard in zip(self.stores, self.shards, strict=True)),
            return_exceptions=True,
        )

    async def all(self, call: Callable[[T], Awaitable[R]]) -> list[R]:
        """``call`` on every shard; the first failure (in shard order) is raised."""
        results = await self.each(call)
        out: list[R] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            out.append(result)
        return out

    async def close_all(self, close: Callable[[T], Awaitable[None]]) -> None:
        """Close every shard, even when one fails; then raise the first failure. Once:
        closing again does nothing."""
        if self.closed:
            return
        self.closed = True
        results = await self._each(close)
        for result in results:
            if isinstance(result, BaseException):
                raise result
