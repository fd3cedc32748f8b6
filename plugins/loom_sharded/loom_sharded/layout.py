"""The layout record: each shard remembers the layout it was first opened in.

Routing depends on the shard names (and their positions, for default names) and on
``colocate``. Opened with another layout, the same data would be looked for on the wrong
shards: existing executions would read as empty, and a new start of one would create a
second log on another shard. So the first open writes, on every shard, one event to the
reserved log :data:`LAYOUT_ID` naming every shard, the shard it is written on and the
``colocate`` separator; every later open (:func:`check_records`) reads it back and refuses a
different layout with :class:`~loom_sharded.errors.ShardLayoutChangedError` before anything
is routed. Appends never read it: the check costs one read per shard at open.

Accepted: reordering *named* shards (an id's owner depends on names only). Refused: a
shard added, removed or renamed, default-named shards reordered, ``colocate`` changed, a
store holding another shard's record (the same database given twice under two URLs), and
a shard of another sharded storage with the same names (each first open draws a random
deployment id that every shard's record carries).
A shard with no record among shards whose records all match is given one: that is a
first open stopped before every shard was written (or a shard emptied since, which the
records cannot tell apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from loom_core import NewEvent
from loom_core.errors import ConflictError, LoomError
from loom_core.spi import EventStore
from loom_sharded.errors import Shard, ShardLayoutChangedError, ShardUnavailableError
from loom_sharded.placement import Placement, on_shard
from loom_sharded.routing import default_names

__all__ = ["LAYOUT_ID", "LAYOUT_KIND", "Layout", "check_records"]

LAYOUT_ID: Final = "$loom-sharded:layout"
"""The reserved log, on every shard, holding that shard's layout record. The sharded
store leaves it out of ``list_executions``."""
LAYOUT_KIND: Final = "SHARD_LAYOUT"
_VERSION: Final = 1

logger = logging.getLogger("loom_sharded")


@dataclass(frozen=True, slots=True)
class Layout:
    """What routing depends on, as one shard records it."""

    names: tuple[str, ...]
    """Every shard's name, shard 0 first."""
    shard: str
    """The name of the shard this record is on."""
    colocate: str | None
    deployment: str = ""
    """A random id drawn at the first open and written on every shard: shards of two
    sharded storages with the same names carry different ones."""

    def event(self) -> NewEvent:
        return NewEvent(
            LAYOUT_KIND,
            {"version": _VERSION, "names": list(self.names), "shard": self.shard,
             "colocate": self.colocate, "deployment": self.deployment},
        )

    @classmethod
    def parse(cls, payload: object) -> Layout | None:
        """The layout in a record's payload, or None for one this version cannot read."""
        if not isinstance(payload, dict) or payload.get("version") != _VERSION:
            return None
        names, shard, colocate = payload.get("names"), payload.get("shard"), payload.get(
            "colocate")
        deployment = payload.get("deployment")
        if (not isinstance(names, list) or not all(isinstance(n, str) for n in names)
                or not isinstance(shard, str) or not isinstance(deployment, str)
                or not (colocate is None or isinstance(colocate, str))):
            return None
        return cls(tuple(names), shard, colocate, deployment)


_Recorded = Layout | None | ShardUnavailableError
"""A shard's record, None when it has none, or the error of a shard that is down."""


async def _recorded(placement: Placement[EventStore]) -> list[_Recorded]:
    async def one(store: EventStore, shard: Shard) -> _Recorded:
        try:
            with on_shard(shard):
                events = await store.read(LAYOUT_ID, limit=1)
        except ShardUnavailableError as down:
            return down
        if not events:
            return None
        layout = Layout.parse(events[0].payload)
        if layout is None:
            raise ShardLayoutChangedError(
                shard,
                f"its layout record ({LAYOUT_ID!r}) is not one this version of loom-sharded "
                "can read",
                "open it with the version that wrote it",
            )
        return layout

    return list(await asyncio.gather(
        *(one(store, shard) for store, shard in zip(placement.stores, placement.shards,
                                                    strict=True))
    ))


def _compare(current: Layout, recorded: Layout, shard: Shard, names: Sequence[str]) -> None:
    """Raise :class:`ShardLayoutChangedError` when ``recorded`` routes unlike ``current``."""
    keep = "reopen with the layout it was written with"
    if recorded.shard != current.shard:
        if recorded.shard in names:
            where = names.index(recorded.shard)
            raise ShardLayoutChangedError(
                shard,
                f"it holds the record of shard {recorded.shard!r}, which is now at position "
                f"{where}: either the shard list was reordered while the shards carry default "
                "names (which are positions), or one database is given as two shards",
                "list the shards in their original order, or name them (names=) with the "
                "names they were first opened under; give each database once",
            )
        raise ShardLayoutChangedError(
            shard,
            f"it was first opened as shard {recorded.shard!r}, a name not in the current "
            f"layout {list(names)} (recorded layout {list(recorded.names)})",
            f"renaming a shard moves its executions; {keep}",
        )
    added = sorted(set(current.names) - set(recorded.names))
    removed = sorted(set(recorded.names) - set(current.names))
    if added or removed:
        change = "; ".join(
            part for part in (f"added {added}" if added else "",
                              f"removed {removed}" if removed else "") if part
        )
        positional = ""
        if current.names == default_names(len(current.names)):
            positional = (" (default names are positions: a shard removed or inserted in the "
                          "middle renames every shard after it)")
        raise ShardLayoutChangedError(
            shard,
            f"the shards changed since it was first opened ({change}; recorded "
            f"{list(recorded.names)}, now {list(current.names)}{positional}): the executions "
            "the change moves would be looked for on shards that do not hold them",
            "the decorator does not move data; reopen with the recorded shards, or move the "
            "data and reset the records as docs/sharded.md 'Changing the layout' describes",
        )
    if recorded.colocate != current.colocate:
        raise ShardLayoutChangedError(
            shard,
            f"colocate was {recorded.colocate!r} when it was first opened and is now "
            f"{current.colocate!r}: ids with a separator would route to other shards",
            keep,
        )


async def check_records(placement: Placement[EventStore]) -> None:
    """Write the layout record on a first open, refuse a changed layout on every later one.

    Raises :class:`~loom_sharded.errors.ShardLayoutChangedError` (nothing is written) when
    a shard's record disagrees with ``placement``'s names or ``colocate``. A shard that is
    down is skipped with a WARNING, as ``due`` skips it, so the others open and serve
    their executions (every other shard's record names the shards, so an added, removed
    or renamed shard is still found); only its own record goes unchecked. With every shard
    down, or every shard that answers without a record while one is down (a first open
    cannot then be told from a reopen whose recorded shards are down), the first down
    one's :class:`~loom_sharded.errors.ShardUnavailableError` is raised.
    """
    names = placement.router.names
    current = [Layout(names, name, placement.router.colocate) for name in names]
    recorded = await _recorded(placement)
    down = [r for r in recorded if isinstance(r, ShardUnavailableError)]
    if len(down) == len(recorded):
        raise down[0]
    for error in down:
        logger.warning("a shard is down at open; its layout record is not checked: %s", error)
    deployment = _check_all(placement, current, recorded)
    if deployment is None and down:
        # No shard that answers holds a record: a reopen whose recorded shards are all
        # down (a shard added meanwhile included) cannot be told from a first open.
        raise down[0]
    # Every record present matches; a shard without one is new with all the others (a
    # first open), or its first open stopped part way. A shard added to recorded ones never
    # gets here: their records do not name it. The first record written decides the
    # deployment id (re-read, so two processes opening at once agree on one).
    missing = [i for i, layout in enumerate(recorded) if layout is None]  # down: not written
    drawn: str | None = None  # the deployment id this open drew, if it is the first
    try:
        for index in missing:
            if deployment is None:
                drawn = uuid.uuid4().hex
                await _write(placement, index, replace(current[index], deployment=drawn))
                recorded = await _recorded(placement)
                deployment = _check_all(placement, current, recorded)
            elif recorded[index] is None:
                await _write(placement, index, replace(current[index], deployment=deployment))
        if missing:
            _check_all(placement, current, await _recorded(placement))
    except ShardLayoutChangedError:
        if drawn is not None:
            await _take_back(placement, drawn)
        raise


async def _take_back(placement: Placement[EventStore], drawn: str) -> None:
    """Delete the records this refused first open wrote (those of the deployment it drew,
    ``drawn``), so that a refusal writes nothing: one database given as two shards is
    found only once its first record is written, and left, it would refuse the corrected
    layout next time."""
    for index, layout in enumerate(await _recorded(placement)):
        if isinstance(layout, Layout) and layout.deployment == drawn:
            with contextlib.suppress(LoomError), on_shard(placement.shards[index]):
                await placement.stores[index].delete_execution(LAYOUT_ID)


def _check_all(
    placement: Placement[EventStore], current: Sequence[Layout], recorded: Sequence[_Recorded]
) -> str | None:
    """Compare every record present with the current layout; the deployment id they share
    (None when no shard has a record)."""
    names = placement.router.names
    first: tuple[Shard, str] | None = None
    for shard, mine, theirs in zip(placement.shards, current, recorded, strict=True):
        if not isinstance(theirs, Layout):
            continue
        _compare(mine, theirs, shard, names)
        if first is None:
            first = (shard, theirs.deployment)
        elif theirs.deployment != first[1]:
            raise ShardLayoutChangedError(
                shard,
                f"its layout record is of another sharded storage than {first[0]}'s "
                f"(deployment {theirs.deployment}, not {first[1]}), though the names agree: "
                "a database of another deployment is given as this shard",
                "give each shard the database it was first opened with",
            )
    return None if first is None else first[1]


async def _write(placement: Placement[EventStore], index: int, layout: Layout) -> None:
    shard = placement.shards[index]
    try:
        with on_shard(shard):
            await placement.stores[index].append(LAYOUT_ID, [layout.event()], expected_sequence=0)
    except ConflictError:
        pass  # another process (or another URL of the same store) wrote first: re-read
    except ShardUnavailableError as error:
        logger.warning("a shard went down at open; its layout record is not written: %s",
                       error)
