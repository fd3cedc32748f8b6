"""The store clock and the one way times are written to the file.

Times are stored as INTEGER microseconds since the Unix epoch, UTC: exact for every
``datetime`` (which has microsecond resolution), ordered by plain integer comparison, and
the same on every process of the host. The store clock is the host clock
(``datetime.now(UTC)``) unless the storage was opened with a ``clock`` option; it is read
on the connection's thread inside the transaction that uses it, so lease expiry is decided
in the same order as the writes that SQLite serialises across processes.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Final

from loom_core.errors import InvalidOptionError
from loom_sqlite.settings import Clock

__all__ = ["from_micros", "host_clock", "now_micros", "to_micros"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO: Final = timedelta(microseconds=1)


def host_clock() -> datetime:
    return datetime.now(UTC)


def to_micros(value: datetime) -> int:
    """Microseconds since the epoch of an aware ``datetime``."""
    return (value - _EPOCH) // _MICRO


def from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def now_micros(clock: Clock) -> int:
    """Read ``clock``; refuse a naive or non-datetime answer, or one past the year 9999 in
    UTC, which no stored time could be read back as (a misconfigured clock)."""
    if clock is host_clock:
        # The same system clock ``datetime.now`` reads, and truncated as it truncates,
        # without building the datetime only to take it apart (every append reads it).
        return time.time_ns() // 1_000
    now = clock()
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise InvalidOptionError(
            f"the storage clock returned {now!r}; it must return an aware datetime"
        )
    try:
        now.astimezone(UTC)
    except OverflowError:
        raise InvalidOptionError(
            f"the storage clock returned {now.isoformat()}, which falls outside the years 1 "
            "to 9999 in UTC; it must return a time a datetime can hold in UTC"
        ) from None
    return to_micros(now)
