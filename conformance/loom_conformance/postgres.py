"""A throwaway PostgreSQL server for tests: started here, or taken from the environment.

Any store that talks to PostgreSQL (``loom-postgres``, or a third party's) tests against
a real server this way::

    # conftest.py
    from loom_conformance.postgres import loom_postgres_server  # re-export the fixture

    @pytest.fixture
    def loom_storage_factory(loom_postgres_server):
        async def open_fresh():
            url = loom_postgres_server.fresh_database()
            return await open_storage(url)
        return open_fresh

Where the server comes from:

* ``LOOM_TEST_POSTGRES_URL`` set: that server is used as is (the role needs CREATEDB for
  :meth:`PostgresServer.fresh_database`). Nothing is started or stopped.
* otherwise a new cluster is made with ``initdb`` in a temporary directory and started with
  ``pg_ctl`` on ``127.0.0.1`` and a free port, as an unprivileged user when this process
  runs as root (``initdb`` refuses root: the user is ``LOOM_TEST_POSTGRES_OS_USER``, else
  ``nobody``), and stopped and deleted at the end. The binaries are taken from
  ``LOOM_TEST_POSTGRES_BIN`` when it is set (and only from there), else looked up with
  ``pg_config --bindir``, in ``/usr/lib/postgresql/*/bin`` (newest first) and ``PATH``.

Under ``CI=true`` a missing server or a failed start fails the run; it never skips. Outside
CI a machine with no PostgreSQL at all skips the tests that need it, with a reason.

A started cluster is watched by a small reaper process (``/bin/sh``, as the cluster's
user, in its own session): when the process that started the cluster is gone without
destroying it (a test run killed with SIGKILL, or SIGTERM, which skips ``atexit``), the
reaper stops the server (``-m immediate``) and deletes its directory within about a
second, so no throwaway server outlives its test run.

The cluster is tuned for tests, not for safety against power loss: ``fsync=off`` and
``full_page_writes=off`` (a process crash, ``pg_ctl stop -m immediate`` included, still
loses nothing that was committed, because the operating system keeps the written pages;
only an operating-system crash could), ``synchronous_commit=on`` so a commit means what it
means in production. Pass ``settings=`` to :class:`ThrowawayCluster` to change that, e.g.
``DURABLE_SETTINGS`` for a benchmark.

Note for the kit: this module is self-contained and imports ``psycopg`` only inside the
functions that talk to the server (``fresh_database``, the readiness check), so the kit
does not depend on it; a ``loom-conformance[postgres]`` extra could name it. The fixture
may be re-exported from the kit's pytest plugin.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from loom_conformance.ci import in_ci

__all__ = [
    "DURABLE_SETTINGS",
    "TEST_SETTINGS",
    "PostgresServer",
    "PostgresUnavailableError",
    "ThrowawayCluster",
    "find_postgres_bindir",
    "in_ci",
    "loom_postgres_server",
    "postgres_server",
    "with_database",
]

URL_ENV: Final = "LOOM_TEST_POSTGRES_URL"
BIN_ENV: Final = "LOOM_TEST_POSTGRES_BIN"
OS_USER_ENV: Final = "LOOM_TEST_POSTGRES_OS_USER"

TEST_SETTINGS: Final[Mapping[str, str]] = {
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
    "max_connections": "300",
    "shared_buffers": "64MB",
    "max_wal_size": "1GB",
    "checkpoint_timeout": "30min",
    "max_locks_per_transaction": "256",
    "log_min_messages": "warning",
    "log_line_prefix": "%m [%p] ",
    "deadlock_timeout": "200ms",
}
"""Fast and crash-safe for a process crash; not for an operating-system crash."""

DURABLE_SETTINGS: Final[Mapping[str, str]] = {
    **TEST_SETTINGS,
    "fsync": "on",
    "full_page_writes": "on",
    "deadlock_timeout": "1s",
}
"""Production-like durability (every commit flushed to disk): for benchmarks."""


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server could be found or started; the message says what to install
    or set."""


def find_postgres_bindir() -> Path | None:
    """The directory holding ``initdb``/``pg_ctl``, or None when PostgreSQL is absent."""
    explicit = os.environ.get(BIN_ENV)
    if explicit:
        # An explicit choice is the only one: a wrong path must not silently fall back.
        path = Path(explicit)
        return path if (path / "initdb").is_file() and (path / "pg_ctl").is_file() else None
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            candidates.append(Path(out))

    def major(path: str) -> int:
        name = Path(path).parent.name
        return int(name) if name.isdigit() else -1

    candidates.extend(
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True)
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for candidate in candidates:
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _os_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None to run as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get(OS_USER_ENV, "nobody")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise PostgresUnavailableError(
            f"running as root, PostgreSQL must run as an unprivileged user, but {name!r} "
            f"does not exist; create it or set {OS_USER_ENV}"
        ) from None
    return entry.pw_uid, entry.pw_gid


@dataclass(slots=True)
class ThrowawayCluster:
    """One PostgreSQL cluster in a temporary directory, on loopback.

    ``start()`` runs initdb (once) and pg_ctl start; ``stop(mode)`` stops it
    (``"immediate"`` is a crash); ``start()`` again restarts it on the same port with
    the same data. ``destroy()`` stops it and deletes the directory. Usable as a context
    manager.
    """

    settings: Mapping[str, str] = field(default_factory=lambda: dict(TEST_SETTINGS))
    bindir: Path | None = None
    superuser: str = "postgres"
    port: int = 0
    root: Path | None = None
    _owner: tuple[int, int] | None = None
    _initialised: bool = False
    _running: bool = False
    _reaper: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Superuser URL of the ``postgres`` database."""
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/postgres"

    @property
    def data_dir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    @property
    def running(self) -> bool:
        return self._running

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        assert self.bindir is not None
        kwargs: dict[str, object] = {}
        if self._owner is not None:
            uid, gid = self._owner
            kwargs.update(user=uid, group=gid, extra_groups=[])
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LC_ALL": "C",
            "HOME": str(self.root),
        }
        try:
            return subprocess.run(  # type: ignore[call-overload, no-any-return]
                [str(self.bindir / args[0]), *args[1:]],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                cwd=str(self.root),
                check=True,
                **kwargs,
            )
        except subprocess.CalledProcessError as exc:
            log = ""
            if self.root is not None and self.log_file.exists():
                log = self.log_file.read_text(errors="replace")[-3000:]
            raise PostgresUnavailableError(
                f"{args[0]} failed ({exc.returncode}): {exc.stderr.strip() or exc.stdout.strip()}"
                + (f"\nserver log tail:\n{log}" if log else "")
            ) from exc

    def _initdb(self) -> None:
        if self.bindir is None:
            self.bindir = find_postgres_bindir()
        if self.bindir is None:
            raise PostgresUnavailableError(
                "PostgreSQL server binaries (initdb, pg_ctl) were not found; install "
                f"postgresql (e.g. apt-get install postgresql), set {BIN_ENV}, or point "
                f"{URL_ENV} at a server"
            )
        self._owner = _os_user()
        self.root = Path(tempfile.mkdtemp(prefix="loom-pg-"))
        if self._owner is not None:
            os.chown(self.root, *self._owner)
        self._run(
            "initdb", "-D", str(self.data_dir), "-U", self.superuser, "-A", "trust",
            "-E", "UTF8", "--locale=C", "--no-sync",
        )
        # Settings go into the configuration file (quoted), not onto the command line,
        # where pg_ctl would split a value containing a space.
        lines = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = {_quote_setting(str(self.root))}",
        ]
        lines += [f"{key} = {_quote_setting(value)}" for key, value in self.settings.items()]
        with (self.data_dir / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# loom_conformance.postgres test settings\n")
            conf.write("\n".join(lines) + "\n")
        self._initialised = True

    def start(self) -> None:
        """Create (first time) and start the cluster; wait until it accepts connections."""
        if self._running:
            return
        if not self._initialised:
            self._initdb()
        # Another process may take the port between our probe and the bind: try a few.
        last: PostgresUnavailableError | None = None
        fixed = self.port != 0
        for _ in range(1 if fixed else 5):
            port = self.port if fixed else _free_port()
            try:
                self._run(
                    "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
                    "-t", "60", "-o", f"-p {port}", "start",
                )
            except PostgresUnavailableError as exc:
                last = exc
                continue
            self.port = port
            self._running = True
            self._watch()
            return
        assert last is not None
        raise last

    def _watch(self) -> None:
        """Start the reaper (once per cluster) that cleans up if this process dies."""
        if self._reaper is not None and self._reaper.poll() is None:
            return
        assert self.bindir is not None
        assert self.root is not None
        kwargs: dict[str, object] = {}
        if self._owner is not None:
            uid, gid = self._owner
            kwargs.update(user=uid, group=gid, extra_groups=[])
        self._reaper = subprocess.Popen(  # type: ignore[call-overload]
            ["/bin/sh", "-c", _REAPER, "loom-pg-reaper", str(os.getpid()),
             str(self.bindir / "pg_ctl"), str(self.data_dir), str(self.root)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd="/", start_new_session=True, **kwargs,
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``mode="immediate"`` is a crash (no shutdown checkpoint)."""
        if not self._running:
            return
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "-t", "60", "stop")
        self._running = False

    def destroy(self) -> None:
        """Stop (fast) and delete the cluster's directory. Safe to call twice."""
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait()
            self._reaper = None
        try:
            if self._running:
                try:
                    self.stop("fast")
                except PostgresUnavailableError:
                    self.stop("immediate")
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None
            self._initialised = False

    def __enter__(self) -> ThrowawayCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


# Watches the process that owns a cluster ($1) and, once it has gone, stops the server
# and deletes its directory. /proc/<pid> is checked first because ``kill -0`` from the
# unprivileged cluster user to a root-owned process fails even while it is alive.
_REAPER: Final = """
parent=$1 pg_ctl=$2 data=$3 root=$4
while [ -d "/proc/$parent" ] || kill -0 "$parent" 2>/dev/null; do sleep 1; done
"$pg_ctl" -D "$data" -m immediate -w -t 30 stop >/dev/null 2>&1
rm -rf "$root"
"""


def _quote_setting(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def with_database(url: str, database: str) -> str:
    """``url`` with its database replaced (the path), every other part kept."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(database, safe="")))


@dataclass(slots=True)
class PostgresServer:
    """A reachable server for tests: ``url`` is an administrative URL (may create
    databases); ``cluster`` is the throwaway cluster, or None for ``LOOM_TEST_POSTGRES_URL``.
    """

    url: str
    cluster: ThrowawayCluster | None = None
    _made: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fresh_database(self, prefix: str = "loom_test") -> str:
        """Create an empty database with a unique name; returns its URL. Dropped by
        :meth:`drop_fresh` (the whole cluster goes at the end anyway)."""
        import psycopg  # type: ignore[import-not-found, unused-ignore]
        from psycopg import sql  # type: ignore[import-not-found, unused-ignore]

        name = f"{prefix}_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        with self._lock:
            self._made.append(name)
        return with_database(self.url, name)

    def drop_fresh(self) -> None:
        """Drop every database :meth:`fresh_database` made (best effort)."""
        import psycopg  # type: ignore[import-not-found, unused-ignore]
        from psycopg import sql  # type: ignore[import-not-found, unused-ignore]

        with self._lock:
            names, self._made = self._made, []
        if not names:
            return
        with contextlib.suppress(psycopg.Error), psycopg.connect(
            self.url, autocommit=True
        ) as conn:
            for name in names:
                with contextlib.suppress(psycopg.Error):
                    conn.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(name)
                        )
                    )


def _wait_ready(url: str, timeout: float = 30.0) -> None:
    import psycopg  # type: ignore[import-not-found, unused-ignore]

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise PostgresUnavailableError(f"{url} is not reachable: {exc}") from exc
            time.sleep(0.2)


@contextlib.contextmanager
def postgres_server(
    settings: Mapping[str, str] | None = None, *, use_environment: bool = True
) -> Iterator[PostgresServer]:
    """A server for the duration of the ``with`` block.

    Uses ``LOOM_TEST_POSTGRES_URL`` when set (and ``use_environment``), else starts a
    :class:`ThrowawayCluster` with ``settings`` (default :data:`TEST_SETTINGS`) and
    destroys it on exit. Raises :class:`PostgresUnavailableError` when neither works.
    """
    external = os.environ.get(URL_ENV) if use_environment else None
    if external:
        _wait_ready(external)
        server = PostgresServer(external)
        try:
            yield server
        finally:
            server.drop_fresh()
        return
    cluster = ThrowawayCluster(settings=dict(settings or TEST_SETTINGS))
    # A test run killed without teardown must not leave a server behind when the
    # interpreter exits normally; atexit covers what the finally below cannot.
    atexit.register(cluster.destroy)
    try:
        cluster.start()
        _wait_ready(cluster.url)
        yield PostgresServer(cluster.url, cluster)
    finally:
        cluster.destroy()
        atexit.unregister(cluster.destroy)


@pytest.fixture(scope="session")
def loom_postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server shared by the whole test session (see the module docstring).

    Skips only outside CI and only when PostgreSQL is not installed at all; under
    ``CI=true`` that, and any failure to start, fails the run.
    """
    if not os.environ.get(URL_ENV) and find_postgres_bindir() is None and not in_ci():
        pytest.skip(
            f"no PostgreSQL: install the server binaries or set {URL_ENV} "
            "(under CI=true this fails instead)"
        )
    context = postgres_server()
    failure: PostgresUnavailableError | None = None
    try:
        server = context.__enter__()
    except PostgresUnavailableError as exc:
        failure = exc
    if failure is not None:
        pytest.fail(f"PostgreSQL test server unavailable: {failure}", pytrace=False)
    try:
        yield server
    finally:
        context.__exit__(None, None, None)
