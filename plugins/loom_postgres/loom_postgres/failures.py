"""How a psycopg failure is read: did the write certainly not happen, may it have, and
which Loom error does the caller get.

The decisive question for a write is whether the server could have committed it:

* a server error with a SQLSTATE (a lock timeout, a deadlock, a read-only database, a
  full disk, …) means the statement's transaction was rolled back: nothing landed;
* a lost connection (no SQLSTATE, class 08, or the server's own shutdown codes 57P01-3)
  after the statement was sent means it may have committed: the caller must find out
  (appends carry a writer id for exactly that) or report the outcome as unknown.

A connection that could not be made at all is read by :func:`rejection`: a login the
server refused (a wrong password, no such role or database, pg_hba.conf) is final, every
other failure (no server yet, one starting up, no connection slot free) may pass.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final

import psycopg
import psycopg_pool
from psycopg import errors as pgerrors

__all__ = ["Failure", "Rejection", "classify", "describe", "option_refusal", "rejection"]


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


@dataclass(frozen=True, slots=True)
class Rejection:
    """A login the server refused: retrying cannot mend it. ``reason`` is one of the
    names :class:`~loom_postgres.ConnectionRejectedError` documents; ``server`` is
    ``host:port`` or the socket; ``role`` / ``database`` the name the server quoted, when
    it did."""

    reason: str
    server: str
    message: str
    role: str | None = None
    database: str | None = None


# One attempt on one host, as libpq words it; psycopg joins several hosts' attempts.
_ATTEMPT: Final = re.compile(
    r'connection to server (?:at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>[0-9]+)'
    r'|on socket "(?P<socket>[^"]*)") failed: (?P<message>.*?)'
    r"(?=connection to server (?:at|on socket) |\Z)",
    re.DOTALL,
)
# The server's own words (lc_messages in English) and libpq's, for the refusals no
# retry can mend. A message in another language is not recognised: such a refusal is
# retried, as a failure that may pass is, until connect_timeout, then reported.
_REFUSALS: Final = (
    ("no_password", re.compile(r"fe_sendauth: no password supplied")),
    ("password", re.compile(r'password authentication failed for user "(?P<role>[^"]*)"')),
    ("role", re.compile(r'role "(?P<role>[^"]*)" does not exist')),
    ("login", re.compile(r'role "(?P<role>[^"]*)" is not permitted to log in')),
    ("database", re.compile(r'database "(?P<database>[^"]*)" does not exist')),
    ("privilege", re.compile(r'permission denied for database "(?P<database>[^"]*)"')),
    ("pg_hba", re.compile(r"pg_hba\.conf rejects connection|no pg_hba\.conf entry for")),
    ("authentication", re.compile(r'authentication failed for user "(?P<role>[^"]*)"')),
)


def rejection(exc: BaseException) -> Rejection | None:
    """The login refusal ``exc`` (a failed connect) reports, when every host it tried
    refused the login; None for any failure that may pass (no server listening, one
    starting up or shutting down, no connection slot free, a name that did not
    resolve)."""
    if not isinstance(exc, psycopg.OperationalError):
        return None
    text = str(exc)
    # psycopg lists each host's attempt on a line of its own when it tried several: one
    # that reached no server may pass.
    if any(
        line.startswith("- host: ") and "connection to server " not in line
        for line in text.splitlines()
    ):
        return None
    found: list[Rejection] = []
    for attempt in _ATTEMPT.finditer(text):
        said = attempt["message"].strip()
        server = (
            attempt["socket"] if attempt["socket"] is not None
            else f"{attempt['host']}:{attempt['port']}"
        )
        for reason, pattern in _REFUSALS:
            match = pattern.search(said)
            if match is not None:
                names = match.groupdict()
                found.append(Rejection(
                    reason, server, said.splitlines()[0],
                    names.get("role"), names.get("database"),
                ))
                break
        else:
            return None
    return found[0] if found else None


# libpq refusing a parameter's value before it connects ('invalid sslmode value: "x"',
# 'invalid require_auth value', a require_auth method given twice…), as psycopg reports
# it when libpq will not even start: English only, as libpq words it; a message it words in
# another language is not recognised, and the open is then retried until connect_timeout.
_BAD_OPTION: Final = re.compile(
    r"^connection is bad: (?P<detail>(?:invalid |[a-z_]+ method ).*?|.*cannot be mixed.*?)\s*$",
    re.DOTALL,
)


def option_refusal(exc: BaseException) -> str | None:
    """What libpq said of a parameter value it refused before connecting, or None."""
    if not isinstance(exc, psycopg.OperationalError):
        return None
    match = _BAD_OPTION.match(str(exc))
    if match is None or "connection to server " in match["detail"]:
        return None
    return " ".join(match["detail"].split())
