"""Opening a PostgreSQL :class:`~loom_core.Storage`: one pool, three stores."""

from __future__ import annotations

import contextlib
import difflib
import re
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Final
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from loom_core import Storage
from loom_core.errors import InvalidURLError, StorageUnavailableError
from loom_postgres.database import Connection, Database, PooledConnection, configure_session
from loom_postgres.errors import (
    ConnectionRejectedError,
    SchemaMigrationError,
    SchemaTooNewError,
)
from loom_postgres.events import PostgresEventStore
from loom_postgres.failures import Rejection, describe, option_refusal, rejection
from loom_postgres.leases import PostgresLeaseStore
from loom_postgres.notify import Listener
from loom_postgres.options import PostgresOptions, parse_options
from loom_postgres.schema import (
    SCHEMA_VERSION,
    migrate_connection,
    refuse_unusable,
    schema_state,
)
from loom_postgres.timers import PostgresTimerStore

__all__ = [
    "SCHEMES",
    "check_connect_failure",
    "check_encoding",
    "check_url",
    "open_postgres",
    "redact",
    "rejected_error",
]

SCHEMES = ("postgresql", "postgres")

RECONNECT_SPAN: Final = 5.0
"""Seconds one of the pool's reconnection series lasts before it gives up. psycopg_pool
waits 1 s after a failed connection, then twice as long after each, for as long as the
series lasts; a series as long as the outage would leave the store waiting about as long
after the server's return as the server was away. Short series keep the longest wait
between tries at 2 s: once one gives up, the next call that finds no connection starts a
new series, whose first try is at once."""

# libpq parameters whose value libpq itself refuses when it connects ("invalid port
# number", "invalid sslmode value"): checked here, so such a typo is an InvalidURLError at
# once instead of a connection retried for connect_timeout. Every entry of a multi-host
# list is checked; an empty one means the default.
_PORT: Final = re.compile(r"^[0-9]{1,5}$")
_INTEGER: Final = re.compile(r"^\s*[-+]?[0-9]+\s*$")
_INTEGER_PARAMETERS: Final = (
    "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout",
)
_CHOICES: Final[Mapping[str, tuple[str, ...]]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any", "read-write", "read-only", "primary", "standby", "prefer-standby",
    ),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
}


# Query parameters libpq takes a secret in: masked like the password of the netloc (the
# SCRAM keys, libpq 18, stand in for the password itself).
_SECRET_PARAMETERS: Final = frozenset({
    "password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key",
})
_UNKNOWN_PARAMETER: Final = re.compile(
    r'invalid (?:URI query parameter|connection option):? "(?P<name>[^"]*)"'
)


def redact(url: str) -> str:
    """``url`` without its passwords (for messages and ``Storage.url``): the one before
    the host and any given as a query parameter (``?password=…``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://(unparseable)"
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0]
        parts = parts._replace(netloc=f"{user}:***@{netloc[1]}")
    if parts.query:
        fields = parts.query.split("&")
        for index, field in enumerate(fields):
            name, equals, _ = field.partition("=")
            if equals and unquote(name) in _SECRET_PARAMETERS:
                fields[index] = f"{name}=***"
        parts = parts._replace(query="&".join(fields))
    return urlunsplit(parts)


def check_url(url: object) -> str:
    """A libpq URL with a postgresql:// or postgres:// scheme (in any case; returned in
    lower case), or InvalidURLError.

    Refuses, before anything connects, an unknown parameter and a value libpq would
    refuse when connecting (a port that is not a number in 1-65535, a non-integer
    timeout, an sslmode it does not know): retrying cannot mend a typo.
    """
    if not isinstance(url, str):
        raise InvalidURLError(f"storage URL must be a str, not {type(url).__name__}")
    scheme, separator, rest = url.partition("://")
    if not separator or scheme.lower() not in SCHEMES:
        raise InvalidURLError(
            f"{redact(url)!r} is not a PostgreSQL URL; use postgresql://user@host:port/db"
        )
    # A scheme is case-insensitive, and open_storage picks this backend in any case; libpq
    # knows only the lower-case prefixes and reads anything else as key=value pairs.
    url = f"{scheme.lower()}://{rest}"
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise InvalidURLError(
            f"{redact(url)!r} is not a valid libpq URL: {_unknown_parameter(str(exc))}"
        ) from None
    problem = _bad_value(params)
    if problem is not None:
        raise InvalidURLError(f"{redact(url)!r} is not a valid libpq URL: {problem}")
    return url


def _unknown_parameter(said: str) -> str:
    """libpq's refusal of a URL, with the parameters the linked libpq knows when it is an
    unknown one: which they are depends on that libpq's version, not on loom-postgres."""
    said = " ".join(said.split())
    match = _UNKNOWN_PARAMETER.search(said)
    if match is None:
        return said
    name = match["name"]
    known = sorted(o.keyword.decode() for o in pq.Conninfo.get_defaults())
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    version = pq.version()
    return (
        f"unknown parameter {name!r}; {hint}the libpq psycopg uses (version "
        f"{version // 10000}.{version % 10000}) knows {', '.join(known)}; a parameter "
        "added by a newer libpq needs a psycopg built with it (pip install -U "
        "psycopg[binary], or a newer system libpq)"
    )


def _bad_value(params: Mapping[str, object]) -> str | None:
    """What is wrong with a value of ``params`` (a parsed URL) that libpq would refuse,
    or None."""
    port = params.get("port")
    if port is not None:
        for entry in str(port).split(","):
            if entry and not (_PORT.match(entry) and 1 <= int(entry) <= 65535):
                return f"port {entry!r} is not a number from 1 to 65535"
    for name in _INTEGER_PARAMETERS:
        value = params.get(name)
        if value is not None and not _INTEGER.match(str(value)):
            return f"{name} {str(value)!r} is not a whole number"
    for name, choices in _CHOICES.items():
        value = params.get(name)
        if value is not None and str(value) not in choices:
            return f"{name} {str(value)!r} is not one of {', '.join(choices)}"
    return None


def _with_url_connect_timeout(
    url: str, opts: PostgresOptions, given: Mapping[str, object]
) -> PostgresOptions:
    """``opts`` with the URL's own ``connect_timeout`` (a positive number of seconds)
    when the options do not set one: the pool hands libpq the option's, which would
    override the URL's. libpq's 0, no limit at all, is not taken: opening must end."""
    if "connect_timeout" in given:
        return opts
    seconds = conninfo_to_dict(url).get("connect_timeout")
    if seconds is None or int(str(seconds)) <= 0:  # a whole number: check_url saw to it
        return opts
    return replace(opts, connect_timeout=float(int(str(seconds))))


async def _ensure_schema(
    pool: AsyncConnectionPool[PooledConnection], options: PostgresOptions, url: str
) -> str:
    """Check the schema version (one query); migrate when it is behind, refuse it when it
    is ahead (SchemaTooNewError). Returns the name of the schema the stores use. Refuses,
    before creating anything, a database whose encoding is not UTF8."""
    async with pool.connection() as conn:
        check_encoding(conn, url)
        version = await schema_state(conn)
        if version == 0 and options.schema is not None:
            await refuse_unusable(conn, options.schema)
        if version > SCHEMA_VERSION:
            row = await (await conn.execute("SELECT current_schema()")).fetchone()
            name = options.schema or (str(row[0]) if row and row[0] else "public")
            raise SchemaTooNewError(name, version, SCHEMA_VERSION)
        behind = version < SCHEMA_VERSION
        if behind and not options.migrate:
            raise SchemaMigrationError(
                f"the Loom schema is at version {version}, this loom-postgres needs "
                f"{SCHEMA_VERSION}; run loom_postgres.migrate(url) as a deploy step, or "
                "open with migrate=True"
            )
        if behind:
            report = await migrate_connection(
                conn, schema=options.schema, lock_timeout=options.migration_lock_timeout
            )
            return report.schema
        row = await (await conn.execute("SELECT current_schema()")).fetchone()
        return str(row[0]) if row and row[0] else "public"


def check_encoding(conn: Connection, url: str) -> None:
    """Refuse a database that does not store UTF8 (read from what the server reported at
    connect, no query): LATIN1 and the like cannot hold most ids and payloads, and in
    SQL_ASCII text comes back as bytes, so that ids would list as ``"b'...'"``."""
    encoding = conn.info.parameter_status("server_encoding")
    if encoding != "UTF8":
        raise InvalidURLError(
            f"the database at {redact(url)} has encoding {encoding}; loom-postgres needs "
            "a UTF8 database (ids, kinds and payloads are Unicode): create one with "
            "CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0"
        )


# What to do about each refusal a login meets (see loom_postgres.failures.rejection).
_REMEDIES: Final[Mapping[str, str]] = {
    "password": "the password is wrong, or the role does not exist (the server does not "
    "say which); check the user and the password given in the URL, PGPASSWORD or "
    "~/.pgpass, and that the role exists",
    "no_password": "the server asks for a password and none was given; put it in the URL, "
    "PGPASSWORD or ~/.pgpass",
    "role": "create the role (CREATE ROLE ... LOGIN) or fix the user in the URL",
    "login": "give the role LOGIN (ALTER ROLE ... LOGIN) or connect as one that may",
    "database": "create the database (CREATE DATABASE) or fix its name in the URL",
    "privilege": "the role lacks the CONNECT privilege: GRANT CONNECT ON DATABASE ... TO "
    "it, or connect as a role that has it",
    "pg_hba": "add a pg_hba.conf entry for this user, database and address (then reload "
    "the server), or connect as a role it admits",
    "authentication": "the server's authentication method refused the user; check the "
    "credentials that method (its pg_hba.conf entry) expects",
}


def rejected_error(url: str, refused: Rejection, exc: psycopg.Error) -> ConnectionRejectedError:
    """The error for a login the server refused: who, where, why, and what to do."""
    given = conninfo_to_dict(url)
    pgconn = getattr(exc, "pgconn", None)

    def effective(quoted: str | None, key: str, attribute: str) -> str:
        if quoted is not None:
            return quoted
        value = given.get(key)
        if value is None and pgconn is not None:
            with contextlib.suppress(Exception):
                value = getattr(pgconn, attribute).decode("utf-8", "replace")
        return str(value) if value else "(libpq's default)"

    user = effective(refused.role, "user", "user")
    database = effective(refused.database, "dbname", "db")
    return ConnectionRejectedError(
        reason=refused.reason,
        server=refused.server,
        user=user,
        database=database,
        explanation=(
            f"PostgreSQL at {refused.server} refused user {user!r} on database "
            f"{database!r} ({redact(url)}): {refused.message.removeprefix('FATAL:').strip()}; "
            f"{_REMEDIES[refused.reason]}. Not retried: waiting cannot mend it"
        ),
    )


def check_connect_failure(url: str, exc: psycopg.Error) -> None:
    """Raise what retrying cannot mend in a failed connect: InvalidURLError for a value
    libpq refused before connecting (one :func:`check_url` does not know), and
    ConnectionRejectedError for a login the server refused. Return for anything else."""
    bad = option_refusal(exc)
    if bad is not None:
        raise InvalidURLError(f"{redact(url)!r} is not a valid libpq URL: {bad}") from exc
    refused = rejection(exc)
    if refused is not None:
        raise rejected_error(url, refused, exc) from exc


async def _probe(url: str, connect_timeout: float) -> str | None:
    """Connect once, and close: None when that works. A login the server refuses is a
    :class:`ConnectionRejectedError` at once (run before the pool, which would try again
    until ``connect_timeout``). Any other failure (no server listening yet, one starting
    up, no connection slot free) may pass: its account is returned, since the pool, when
    it times out, only says so (it logs each reason as a warning)."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            url, autocommit=True, connect_timeout=max(1, round(connect_timeout))
        )
    except psycopg.Error as exc:
        check_connect_failure(url, exc)
        return describe(exc)
    await conn.close()
    return None


async def open_postgres(url: str, options: Mapping[str, object]) -> Storage:
    """The ``postgresql://`` / ``postgres://`` backend factory.

    Opens one pool (shared by the event, timer and lease stores), creates or migrates
    the schema on first connect, and returns the storage; closing it closes the pool.
    Refuses an unknown option or a bad value (InvalidOptionError), a malformed URL
    (InvalidURLError); a login the server refuses (a wrong password, no such role or
    database, pg_hba.conf) is ConnectionRejectedError at once; an unreachable server,
    retried until ``connect_timeout``, is StorageUnavailableError.
    """
    url = check_url(url)
    opts = _with_url_connect_timeout(url, parse_options(options), options)
    deadline = time.monotonic() + opts.connect_timeout
    failed = await _probe(url, opts.connect_timeout)

    async def configure(conn: PooledConnection) -> None:
        await configure_session(conn, opts)

    pool: AsyncConnectionPool[PooledConnection] = AsyncConnectionPool(
        url,
        connection_class=PooledConnection,
        min_size=opts.pool_min_size,
        max_size=opts.pool_max_size,
        kwargs={"autocommit": True, "connect_timeout": max(1, round(opts.connect_timeout))},
        configure=configure,
        open=False,
        timeout=opts.reconnect_timeout,
        reconnect_timeout=RECONNECT_SPAN,
        name="loom-postgres",
    )
    try:
        # The probe's wait counts against connect_timeout: an unreachable server is not
        # waited for twice.
        await pool.open(wait=True, timeout=max(0.001, deadline - time.monotonic()))
    except (PoolTimeout, psycopg.Error) as exc:
        with contextlib.suppress(Exception):
            await pool.close()
        reason = describe(exc)
        if isinstance(exc, PoolTimeout):
            # The server may have come back meanwhile, and refused the login since.
            reason = await _probe(url, opts.connect_timeout) or failed or reason
        raise StorageUnavailableError(f"cannot connect to {redact(url)}: {reason}") from exc
    try:
        namespace = await _ensure_schema(pool, opts, url)
    except (PoolTimeout, psycopg.Error) as exc:
        await pool.close()
        raise StorageUnavailableError(
            f"cannot read the Loom schema's version at {redact(url)}: {describe(exc)}"
        ) from exc
    except BaseException:
        await pool.close()
        raise
    db = Database(pool, opts)

    async def listen_connection() -> Connection:
        # UTF8 whatever the URL's client_encoding: a notification names an execution id,
        # and one the URL's encoding cannot hold makes the server end the connection.
        return await psycopg.AsyncConnection.connect(
            url,
            autocommit=True,
            connect_timeout=max(1, round(opts.connect_timeout)),
            client_encoding="UTF8",
        )

    listener = Listener(
        listen_connection, buckets=opts.notify_buckets, namespace=namespace, warn=db.warn
    )
    events = PostgresEventStore(db, listener)
    return Storage(
        events,
        PostgresTimerStore(db),
        PostgresLeaseStore(db),
        url=redact(url),
        on_close=pool.close,
    )
