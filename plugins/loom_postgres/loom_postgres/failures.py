"""How a psycopg failure is read: did the write certainly not happen, may it have, and
which Loom error does the caller get.

The decisive question for a write is whether the server could have committed it:

* a server error with a SQLSTATE (a lock timeout, a deadlock, a read-only database, a
  full disk, …) means the statement's transaction was rolled back: nothing landed;
* a lost connection (no SQLSTATE, class 08, or the server's own shutdown codes 57P01-3)
  after the statement was sent means it may have committed: the caller must find out
  (appends carry a writer id for exactly that) or report the outcome as unknown.
"""

from __future__ import annotations

import enum
from typing import Final

import psycopg
import psycopg_pool
from psycopg import errors as pgerrors

__all__ = ["Failure", "classify", "describe"]


class Failure(enum.Enum):
    """What a failure means for a write."""

    CONNECTION = "connection"
    """The connection broke: a write that was sent may or may not have committed."""
    UNAVAILABLE = "unavailable"
    """No connection could be had at all: nothing was sent."""
    TRANSIENT = "transient"
    """Rolled back by a deadlock, a serialization failure or a racing insert: re-run."""
    LOCK_TIMEOUT = "lock_timeout"
    """Rolled back after lock_timeout: nothing landed."""
    REFUSED = "refused"
    """Rolled back because the server cannot make the write durable (read-only, disk
    full, out of resources, I/O error): nothing landed."""
    CANCELED = "canceled"
    """Rolled back by statement_timeout or a cancel request: nothing landed."""
    OTHER = "other"
    """Any other server error (a bug, a missing schema): rolled back."""


_SHUTDOWN: Final = {"57P01", "57P02", "57P03"}
_TRANSIENT: Final = {"40001", "40P01", "23505"}
_REFUSED_CLASSES: Final = {"53", "58", "XX"}
_REFUSED: Final = {"25006", "25P02"}


def classify(exc: BaseException) -> Failure:
    """Read ``exc`` (raised by psycopg or the pool) as a :class:`Failure`."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed):
        return Failure.UNAVAILABLE
    if not isinstance(exc, psycopg.Error):
        return Failure.OTHER
    state = exc.sqlstate
    if state is None or state.startswith("08") or state in _SHUTDOWN:
        return Failure.CONNECTION
    if isinstance(exc, pgerrors.LockNotAvailable):
        return Failure.LOCK_TIMEOUT
    if state in _TRANSIENT:
        return Failure.TRANSIENT
    if isinstance(exc, pgerrors.QueryCanceled):
        return Failure.CANCELED
    if state in _REFUSED or state[:2] in _REFUSED_CLASSES:
        return Failure.REFUSED
    return Failure.OTHER


def describe(exc: BaseException) -> str:
    """A one-line account of ``exc`` for an error message (SQLSTATE included)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__} [{state}]: {text}" if state else f"{type(exc).__name__}: {text}"
