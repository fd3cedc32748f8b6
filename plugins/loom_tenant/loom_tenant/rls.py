"""Row-level security for ``loom-postgres`` tables: the tenant boundary, again, in the database.

The tenant decorator already keeps tenants apart through the API. This is defence in depth
for the day something reaches the tables without it (a bug, a script, a mis-wired store):
each Loom table gets a policy that shows and accepts only rows whose id starts with the
prefix of the tenant named by the session setting ``loom.tenant``, computed in SQL exactly
as :class:`~loom_tenant.codec.TenantCodec` computes it (``char_length(t) || ':' || t || '/'``).

Use it with an application role that is **not** the tables' owner and has no
``BYPASSRLS`` (an owner or a superuser is not subject to the policy), and open each tenant's
storage with the tenant set on every pooled connection through the libpq ``options``
parameter (no SQL text is built from the tenant name)::

    # once, as the owner, after loom-postgres created its schema
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        await enable_row_level_security(conn, schema="loom")

    url = session_url(app_url, tenant="acme")       # adds options=-c loom.tenant=acme
    storage = await open_storage(url, options={"schema": "loom", "migrate": False},
                                 decorators=[("tenant", {"tenant": "acme"})])

A session without ``loom.tenant`` sees no row and can write none (fail closed). The policy
does not cover LISTEN/NOTIFY: ``loom-postgres`` notifications may carry other tenants'
stored ids to the application role (the decorator never hands them to a tenant).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from loom_core.errors import InvalidOptionError, InvalidURLError
from loom_tenant.codec import check_tenant

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = [
    "POLICY",
    "SETTING",
    "TENANT_COLUMNS",
    "enable_row_level_security",
    "session_options",
    "session_url",
]

SETTING: Final = "loom.tenant"
"""The session setting that names the tenant a connection acts for."""

POLICY: Final = "loom_tenant_isolation"

TENANT_COLUMNS: Final[Mapping[str, str]] = {
    "loom_executions": "execution_id",
    "loom_events": "execution_id",
    "loom_fences": "execution_id",
    "loom_timers": "execution_id",
    "loom_leases": "key",
}
"""Each ``loom-postgres`` table and the column that holds the tenant-encoded id."""

# The prefix of the session's tenant, or NULL when no tenant is set (then every
# comparison is NULL, so nothing is visible or writable).
_PREFIX_FUNCTION: Final = """
CREATE OR REPLACE FUNCTION loom_tenant_prefix() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $loom$
    SELECT char_length(t) || ':' || t || '/'
    FROM (SELECT nullif(current_setting('loom.tenant', true), '') AS t) AS session
$loom$
"""
_ENABLE: Final = "ALTER TABLE {table} ENABLE ROW LEVEL SECURITY"
_DROP: Final = "DROP POLICY IF EXISTS {policy} ON {table}"
_CREATE: Final = (
    "CREATE POLICY {policy} ON {table} "
    "USING (starts_with({column}, loom_tenant_prefix())) "
    "WITH CHECK (starts_with({column}, loom_tenant_prefix()))"
)


async def enable_row_level_security(
    conn: AsyncConnection[object], *, schema: str | None = None
) -> None:
    """Create the tenant policy on every Loom table of ``schema`` (default: the
    connection's current schema), in one transaction. Run it as the tables' owner, after
    ``loom-postgres`` created them; running it again replaces the policies.

    Only identifiers (the schema, table, column and policy names) enter the SQL text,
    quoted by psycopg; there are no values.
    """
    from psycopg import sql

    async with conn.transaction():
        if schema is not None:
            await conn.execute(
                sql.SQL("SELECT set_config('search_path', %s, true)"),
                [sql.Identifier(schema).as_string(conn)],
            )
        await conn.execute(_PREFIX_FUNCTION)
        for table, column in TENANT_COLUMNS.items():
            names = {
                "table": sql.Identifier(table),
                "column": sql.Identifier(column),
                "policy": sql.Identifier(POLICY),
            }
            for statement in (_ENABLE, _DROP, _CREATE):
                await conn.execute(sql.SQL(statement).format(**names))


def session_options(tenant: str, *, role: str | None = None) -> str:
    """The libpq ``options`` value that sets ``loom.tenant`` (and, given, the ``role``)
    on every connection. Refuses a tenant the decorator would refuse."""
    tenant = check_tenant(tenant)
    parts = [f"-c {SETTING}={_escape(tenant)}"]
    if role is not None:
        if not isinstance(role, str) or not role or any(ord(c) < 0x20 for c in role):
            raise InvalidOptionError(f"role must be a non-empty printable str, got {role!r}")
        parts.append(f"-c role={_escape(role)}")
    return " ".join(parts)


def session_url(url: str, tenant: str, *, role: str | None = None) -> str:
    """``url`` with :func:`session_options` added to its query (an existing ``options``
    parameter is kept, ours appended)."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidURLError(f"{url!r} is not a postgresql:// URL")
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = session_options(tenant, role=role)
    merged = [(k, f"{v} {ours}" if k == "options" else v) for k, v in query]
    if not any(k == "options" for k, _ in query):
        merged.append(("options", ours))
    # libpq decodes %XX but not '+', so spaces must be percent-encoded.
    return urlunsplit(parts._replace(query=urlencode(merged, quote_via=quote)))


def _escape(value: str) -> str:
    # libpq splits ``options`` on unescaped spaces and unescapes backslashes.
    return value.replace("\\", "\\\\").replace(" ", "\\ ")
