"""Which shard owns an id: rendezvous (highest-random-weight) hashing over shard names.

Each shard scores every id with a keyed 64-bit BLAKE2b of ``name NUL id``; the highest score
owns the id. The score of a shard depends only on its own name and the id, so:

- routing is stable across processes, restarts and Python versions (no ``hash()``);
- adding a shard moves exactly the ids the new shard now wins, about ``1/(N+1)`` of them,
  all *to* the new shard, and nothing moves between old shards
  (:func:`measure_movement` measures it; ``python -m loom_sharded.movement`` prints it);
- removing a shard moves only the ids it owned; reordering named shards moves nothing.

Shard names are therefore part of the data's placement: renaming a shard moves its ids.

Co-location: with a ``colocate`` separator, an id routes by its *stem*, the text before the
first separator (``order-42/child-1`` routes as ``order-42`` with ``colocate="/"``), so a
parent and its children, or a log and its branches, share a shard and ``append_many`` and
``copy_prefix`` work across them. An id without the separator (or starting with it) routes
by the whole id.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from loom_core.errors import InvalidExecutionIdError, InvalidOptionError
from loom_core.spi import check_key

__all__ = ["Movement", "ShardRouter", "default_names", "measure_movement"]

_CACHE_SIZE: Final = 65_536
_PERSON: Final = b"loom-shard"


def default_names(count: int) -> tuple[str, ...]:
    """The names shards get when none are given: ``shard-0``, ``shard-1``, …."""
    return tuple(f"shard-{i}" for i in range(count))


def _check_option(value: object, what: str) -> str:
    try:
        return check_key(value, what)
    except InvalidExecutionIdError as error:
        raise InvalidOptionError(f"{what} {error.value!r} refused: {error.reason}") from None


def _score(name: bytes, key: str) -> int:
    digest = hashlib.blake2b(name + b"\x00" + key.encode("utf-8"), digest_size=8,
                             person=_PERSON).digest()
    return int.from_bytes(digest, "big")


class ShardRouter:
    """Maps an id (execution id or lease key) to the index of the shard that owns it."""

    __slots__ = ("_encoded", "colocate", "names", "owner")

    def __init__(self, names: Sequence[str], *, colocate: str | None = None) -> None:
        if isinstance(names, str) or not isinstance(names, Sequence) or not names:
            raise InvalidOptionError("shard names must be a non-empty sequence of str")
        checked = tuple(_check_option(name, "shard name") for name in names)
        if len(set(checked)) != len(checked):
            raise InvalidOptionError(f"shard names must be unique, got {list(checked)}")
        if colocate is not None:
            colocate = _check_option(colocate, "colocate separator")
        self.names = checked
        self.colocate = colocate
        self._encoded = tuple(name.encode("utf-8") for name in checked)
        self.owner = functools.lru_cache(maxsize=_CACHE_SIZE)(self._owner)

    def stem(self, key: str) -> str:
        """What ``key`` routes by: its text before the ``colocate`` separator, or all of it."""
        if self.colocate is not None:
            stem, found, _ = key.partition(self.colocate)
            if found and stem:
                return stem
        return key

    def _owner(self, key: str) -> int:
        key = self.stem(key)
        best, best_score = 0, -1
        for index, name in enumerate(self._encoded):
            score = _score(name, key)
            if score > best_score:  # a tie (2**-64) goes to the lower index, stably
                best, best_score = index, score
        return best

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True, slots=True)
class Movement:
    """What adding one shard to ``shards`` shards did to ``ids`` ids."""

    shards: int
    ids: int
    moved: int
    moved_elsewhere: int
    """Ids that moved to an *old* shard: rendezvous hashing makes this 0."""

    @property
    def fraction(self) -> float:
        return self.moved / self.ids

    @property
    def ideal(self) -> float:
        return 1 / (self.shards + 1)


def measure_movement(shards: int, ids: Iterable[str]) -> Movement:
    """Route ``ids`` over ``shards`` default-named shards, then over one more, and count."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise InvalidOptionError(f"shards must be an int >= 1, got {shards!r}")
    before = ShardRouter(default_names(shards))
    after = ShardRouter(default_names(shards + 1))
    total = moved = elsewhere = 0
    for key in ids:
        total += 1
        old, new = before.owner(key), after.owner(key)
        if old != new:
            moved += 1
            if new != shards:
                elsewhere += 1
    if total == 0:
        raise InvalidOptionError("measure_movement needs at least one id")
    return Movement(shards, total, moved, elsewhere)
