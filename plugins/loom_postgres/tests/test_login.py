"""A login the server refuses (a wrong password, no such role or database, pg_hba.conf)
is refused at once with ConnectionRejectedError, never retried and never echoing the
password; a refusal that may pass (no connection slot free) is still retried.

The session's own server trusts every local login, so these tests start a second
throwaway server the same way (``loom_conformance.postgres``) whose pg_hba.conf asks for
SCRAM-SHA-256 passwords. "Not retried" is read from the server's log: it records every
refused login, so a refusal met once was tried once."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from loom_conformance.ci import in_ci
from loom_conformance.postgres import TEST_SETTINGS, find_postgres_bindir, postgres_server
from loom_postgres import ConnectionRejectedError

from loom_core import Storage, open_storage
from loom_core.errors import StorageError, StorageUnavailableError

PASSWORD = "s3cret-horse"
WRONG = "wr0ng-battery"

HBA = """\
host all postgres 127.0.0.1/32 trust
host trusting all 127.0.0.1/32 trust
host all shut_out 127.0.0.1/32 reject
host all all 127.0.0.1/32 scram-sha-256
"""


@dataclass(frozen=True, slots=True)
class PasswordServer:
    """A server that asks for passwords: ``admin`` is a superuser URL it trusts."""

    admin: str
    port: int
    log: Path

    def url(self, user: str, password: str | None = PASSWORD, database: str = "app") -> str:
        secret = f":{password}" if password is not None else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{database}"

    def refusals(self, text: str) -> int:
        """How many times the server has logged ``text`` (one line per refused login)."""
        return self.log.read_text(errors="replace").count(text)


@pytest.fixture(scope="module")
def password_server() -> Iterator[PasswordServer]:
    # A server of its own, even under LOOM_TEST_POSTGRES_URL: only a started one can be
    # given this pg_hba.conf. Like the session's, it fails under CI=true when PostgreSQL
    # is not installed.
    if find_postgres_bindir() is None and not in_ci():
        pytest.skip("no PostgreSQL server binaries (under CI=true this fails instead)")
    # The server runs as an unprivileged user when the tests run as root: the file it
    # reads must be readable to it.
    folder = Path(tempfile.mkdtemp(prefix="loom-hba-"))
    folder.chmod(0o755)
    hba = folder / "pg_hba.conf"
    hba.write_text(HBA, encoding="utf-8")
    hba.chmod(0o644)
    settings = {
        **TEST_SETTINGS,
        "hba_file": str(hba),
        "password_encryption": "scram-sha-256",
        "lc_messages": "C",
    }
    try:
        with postgres_server(settings, use_environment=False) as server:
            assert server.cluster is not None
            with psycopg.connect(server.url, autocommit=True) as conn:
                for statement in (
                    f"CREATE ROLE alice LOGIN PASSWORD '{PASSWORD}'",
                    f"CREATE ROLE nologin NOLOGIN PASSWORD '{PASSWORD}'",
                    f"CREATE ROLE shut_out LOGIN PASSWORD '{PASSWORD}'",
                    f"CREATE ROLE limited LOGIN PASSWORD '{PASSWORD}' CONNECTION LIMIT 0",
                    "CREATE DATABASE app OWNER alice",
                    "CREATE DATABASE trusting",
                    "CREATE DATABASE locked",
                    "REVOKE CONNECT ON DATABASE locked FROM PUBLIC",
                    "GRANT CREATE ON DATABASE app TO limited",
                ):
                    conn.execute(statement)
            yield PasswordServer(server.url, server.cluster.port, server.cluster.log_file)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def _refused(url: str) -> ConnectionRejectedError:
    # A connect_timeout long enough that a retried refusal would be seen several times.
    with pytest.raises(ConnectionRejectedError) as caught:
        await open_storage(url, options={"connect_timeout": 3.0})
    error = caught.value
    assert isinstance(error, StorageError)
    assert not isinstance(error, StorageUnavailableError)
    for secret in (PASSWORD, WRONG):
        assert secret not in str(error)
    return error


async def test_a_wrong_password_is_refused_at_once_naming_user_and_server(
    password_server: PasswordServer,
) -> None:
    line = 'password authentication failed for user "alice"'
    before = password_server.refusals(line)

    error = await _refused(password_server.url("alice", WRONG))

    assert (error.reason, error.user, error.database) == ("password", "alice", "app")
    assert error.server == f"127.0.0.1:{password_server.port}"
    message = str(error)
    assert f"127.0.0.1:{password_server.port}" in message
    assert "'alice'" in message
    assert "password is wrong" in message
    assert "PGPASSWORD" in message
    assert "postgresql://alice:***@" in message
    assert password_server.refusals(line) == before + 1  # one try, no retry


async def test_a_missing_password_is_refused_at_once(password_server: PasswordServer) -> None:
    error = await _refused(password_server.url("alice", None))
    assert (error.reason, error.user) == ("no_password", "alice")
    assert "none was given" in str(error)


async def test_a_role_that_does_not_exist_is_refused_at_once(
    password_server: PasswordServer,
) -> None:
    # Under password authentication the server answers as for a wrong password.
    error = await _refused(password_server.url("ghost", WRONG))
    assert (error.reason, error.user) == ("password", "ghost")
    assert "role does not exist" in str(error)
    # Where it does not ask for one, it says so.
    line = 'role "ghost" does not exist'
    before = password_server.refusals(line)
    error = await _refused(password_server.url("ghost", None, database="trusting"))
    assert (error.reason, error.user, error.database) == ("role", "ghost", "trusting")
    assert "CREATE ROLE" in str(error)
    assert password_server.refusals(line) == before + 1


async def test_a_database_that_does_not_exist_is_refused_at_once(
    password_server: PasswordServer,
) -> None:
    line = 'database "nowhere" does not exist'
    before = password_server.refusals(line)

    error = await _refused(password_server.url("alice", database="nowhere"))

    assert (error.reason, error.user, error.database) == ("database", "alice", "nowhere")
    assert "CREATE DATABASE" in str(error)
    assert password_server.refusals(line) == before + 1


@pytest.mark.parametrize(
    ("user", "database", "reason", "advice"),
    [
        ("shut_out", "app", "pg_hba", "pg_hba.conf"),
        ("nologin", "app", "login", "LOGIN"),
        ("alice", "locked", "privilege", "GRANT CONNECT"),
    ],
)
async def test_a_login_the_server_configuration_forbids_is_refused_at_once(
    password_server: PasswordServer, user: str, database: str, reason: str, advice: str
) -> None:
    error = await _refused(password_server.url(user, database=database))
    assert (error.reason, error.user, error.database) == (reason, user, database)
    assert advice in str(error)


async def test_the_right_password_opens_the_storage(password_server: PasswordServer) -> None:
    storage = await open_storage(password_server.url("alice"))
    try:
        assert await storage.events.head("x") == 0
        assert PASSWORD not in storage.url
    finally:
        await storage.close()


async def test_a_refusal_that_may_pass_is_still_retried_until_it_passes(
    password_server: PasswordServer,
) -> None:
    """No connection slot free (the role's CONNECTION LIMIT, 53300 as a full server's) is
    retried: the open waits, and succeeds once a slot is free."""
    line = 'too many connections for role "limited"'
    before = password_server.refusals(line)

    async def open_limited() -> Storage:
        return await open_storage(
            password_server.url("limited"),
            options={"connect_timeout": 120.0, "schema": "limited_own"},
        )

    opening = asyncio.create_task(open_limited())
    # Wait (on the server's word, not on a clock) until it has been refused twice.
    while password_server.refusals(line) < before + 2:
        assert not opening.done(), opening
        await asyncio.sleep(0.05)
    with psycopg.connect(password_server.admin, autocommit=True) as conn:
        conn.execute("ALTER ROLE limited CONNECTION LIMIT -1")
    try:
        storage = await opening
        try:
            assert await storage.events.head("x") == 0
        finally:
            await storage.close()
    finally:
        with psycopg.connect(password_server.admin, autocommit=True) as conn:
            conn.execute("ALTER ROLE limited CONNECTION LIMIT 0")



async def test_with_several_hosts_only_a_refusal_by_every_host_is_final(
    password_server: PasswordServer,
) -> None:
    port = password_server.port
    both = f"postgresql://alice:{WRONG}@127.0.0.1:{port},127.0.0.1:{port}/app"
    error = await _refused(both)
    assert error.reason == "password"
    # One host that is not listening may come back and take the password: retried, then
    # reported as unreachable, naming no password.
    for hosts in (f"127.0.0.1:1,127.0.0.1:{port}", f"127.0.0.1:{port},127.0.0.1:1"):
        with pytest.raises(StorageUnavailableError) as caught:
            await open_storage(f"postgresql://alice:{WRONG}@{hosts}/app",
                               options={"connect_timeout": 1})
        assert not isinstance(caught.value, ConnectionRejectedError)
        assert WRONG not in str(caught.value)
