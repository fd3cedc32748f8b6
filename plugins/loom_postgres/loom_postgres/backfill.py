"""The deploy-step :func:`migrate`, and the retired park-fence backfill.

Schemas 1 and 2 ordered an answering append with ``acquire_fence_if`` on the execution's
fence row, so a park needed that row to exist: parks wrote a token-0 row, and a one-time
backfill wrote it for parks from before. Since schema 3 writers are ordered by the head
row every append already locks (see ``loom_postgres.schema``), which every execution with
a log has, so a park needs no fence row and nothing is backfilled any more.
:func:`backfill_park_fences` stays, doing nothing, for deploy scripts that call it.
"""

from __future__ import annotations

import psycopg

from loom_core.errors import InvalidOptionError, StorageUnavailableError
from loom_postgres.database import Connection, configure_session
from loom_postgres.failures import describe
from loom_postgres.options import PostgresOptions, parse_options
from loom_postgres.schema import MigrationReport, migrate_connection
from loom_postgres.storage import check_connect_failure, check_encoding, check_url, redact

__all__ = ["backfill_park_fences", "migrate"]


async def _connect(url: str, options: PostgresOptions) -> Connection:
    """One connection for the deploy step; a login the server refuses (a wrong password,
    no such role or database, pg_hba.conf) is ConnectionRejectedError, a server that
    cannot be reached StorageUnavailableError, with its reason."""
    url = check_url(url)
    try:
        conn = await psycopg.AsyncConnection.connect(
            url, autocommit=True, connect_timeout=max(1, round(options.connect_timeout))
        )
    except psycopg.Error as exc:
        check_connect_failure(url, exc)
        raise StorageUnavailableError(f"cannot connect to {redact(url)}: {describe(exc)}") from exc
    try:
        check_encoding(conn, url)
        await configure_session(conn, options)
    except psycopg.Error as exc:
        await conn.close()
        raise StorageUnavailableError(
            f"cannot set up the session at {redact(url)}: {describe(exc)}"
        ) from exc
    except BaseException:
        await conn.close()
        raise
    return conn


async def migrate(
    url: str,
    *,
    schema: str | None = None,
    backfill_park_fences: bool = True,
    lock_timeout: float = 10.0,
) -> MigrationReport:
    """Create or migrate the Loom schema at ``url`` (a deploy step; every store also does
    it on first connect). Safe to run from several processes at once: they serialise on
    an advisory lock and the later ones find nothing to do. ``backfill_park_fences`` is
    accepted and ignored (see the module docstring).

    Raises SchemaMigrationError when a table lock is not granted within ``lock_timeout``
    seconds (nothing changed; retry), the role may not create the schema, or the server
    refuses the change (a read-only database: a standby); SchemaTooNewError (a
    SchemaMigrationError), changing nothing, when a newer loom-postgres already migrated
    the schema past the version this one knows; ConnectionRejectedError when
    the server refuses the login (a wrong password, no such role or database);
    StorageUnavailableError when the server cannot be reached; InvalidURLError, creating
    nothing, for a database whose encoding is not UTF8.
    """
    options = parse_options(
        {"schema": schema, "backfill_park_fences": backfill_park_fences,
         "migration_lock_timeout": lock_timeout}
    )
    conn = await _connect(url, options)
    try:
        return await migrate_connection(conn, schema=schema, lock_timeout=lock_timeout)
    finally:
        await conn.close()


async def backfill_park_fences(
    url: str, *, schema: str | None = None, batch_size: int = 1000
) -> int:
    """Retired: returns 0 and touches nothing (parks need no fence row since schema 3).

    Still refuses a bad ``batch_size`` (InvalidOptionError) and a malformed URL, as it
    did, so a deploy script that calls it keeps failing loudly on a typo.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidOptionError(f"batch_size must be an int >= 1, got {batch_size!r}")
    parse_options({"schema": schema})
    check_url(url)
    return 0
