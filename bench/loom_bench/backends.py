"""The backends a benchmark can target, and what each offers besides our store.

A backend hands out a URL for each run (a fresh SQLite file per run; ``memory://``; the one
PostgreSQL database, where runs never share an execution id), another database for the
sharded stack, its raw floor and, for PostgreSQL, pgbench. Only :func:`loom_core.open_storage`
ever opens our side, so any installed backend plugin and decorator stack is measured the
same way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import urlsplit, urlunsplit

from loom_bench import raw_postgres
from loom_bench.drive import RunPlan, Tick
from loom_bench.pgbench import PgbenchRun, measure_pgbench
from loom_bench.raw_sqlite import Synchronous, measure_raw_sqlite
from loom_bench.scenarios import Scenario
from loom_bench.statistics import Sample

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "MemoryBackend",
    "PostgresBackend",
    "SqliteBackend",
]

BACKEND_NAMES: Final = ("memory", "sqlite", "postgres")


class Backend(Protocol):
    """What the runner needs of a backend."""

    @property
    def name(self) -> str: ...

    @property
    def scheme(self) -> str:
        """The URL scheme our store registers (checked to report "not installed")."""
        ...

    @property
    def options(self) -> Mapping[str, object]:
        """``open_storage(options=…)`` for our side."""
        ...

    @property
    def raw_label(self) -> str | None:
        """The bare driver of the raw floor, or None when the backend has none."""
        ...

    @property
    def ceiling_label(self) -> str | None:
        """The external tool run beside the floor (pgbench), or None."""
        ...

    async def prepare(self) -> None:
        """Ready the backend once before the first run (tables of the floor, settings)."""
        ...

    def storage_url(self, tag: str) -> str:
        """The URL our side opens for run ``tag``."""
        ...

    async def extra_url(self, tag: str, index: int) -> str:
        """Another database of the same kind (shard ``index`` of the sharded stack)."""
        ...

    async def measure_raw(
        self, scenario: Scenario, plan: RunPlan, tag: str, tick: Tick
    ) -> Sample: ...

    async def measure_ceiling(self, scenario: Scenario, plan: RunPlan, tick: Tick) -> Sample: ...

    async def forget(self, tag: str) -> None:
        """Remove what run ``tag`` left behind, so the next run starts as it did."""
        ...

    def settings(self) -> dict[str, object]:
        """The settings the figures depend on, for the report."""
        ...


@dataclass(slots=True)
class MemoryBackend:
    """``memory://``: no raw floor (nothing to compare an in-process dict with)."""

    name: str = "memory"
    scheme: str = "memory"
    options: Mapping[str, object] = field(default_factory=dict)
    raw_label: str | None = None
    ceiling_label: str | None = None

    async def prepare(self) -> None:
        return None

    def storage_url(self, tag: str) -> str:
        return "memory://"

    async def extra_url(self, tag: str, index: int) -> str:
        return "memory://"

    async def measure_raw(self, scenario: Scenario, plan: RunPlan, tag: str, tick: Tick) -> Sample:
        raise NotImplementedError("memory has no raw floor")

    async def measure_ceiling(self, scenario: Scenario, plan: RunPlan, tick: Tick) -> Sample:
        raise NotImplementedError("memory has no pgbench")

    async def forget(self, tag: str) -> None:
        return None

    def settings(self) -> dict[str, object]:
        return {}


@dataclass(slots=True)
class SqliteBackend:
    """``sqlite:///<workdir>/<tag>.db``: a fresh file per run, for ours and for the floor."""

    workdir: Path
    synchronous: Synchronous = "NORMAL"
    name: str = "sqlite"
    scheme: str = "sqlite"
    raw_label: str | None = "sqlite3"
    ceiling_label: str | None = None

    @property
    def options(self) -> Mapping[str, object]:
        # NORMAL is the store's default; name the setting only when it differs.
        return {} if self.synchronous == "NORMAL" else {"synchronous": self.synchronous}

    async def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _path(self, tag: str) -> Path:
        return self.workdir / f"{tag}.db"

    def database_file(self, tag: str) -> Path:
        """The file of run ``tag`` (a peer's file too: cleared by :meth:`forget`)."""
        return self._path(tag)

    def journal_mode(self, tag: str) -> str | None:
        """``PRAGMA journal_mode`` read back from run ``tag``'s file (WAL is recorded in
        the file itself), or None when the run left no file."""
        import sqlite3

        path = self._path(tag)
        if not path.exists():
            return None
        with contextlib.closing(sqlite3.connect(path)) as db:
            return str(db.execute("PRAGMA journal_mode").fetchone()[0])

    def storage_url(self, tag: str) -> str:
        return f"sqlite:///{self._path(tag)}"

    async def extra_url(self, tag: str, index: int) -> str:
        return self.storage_url(f"{tag}-shard{index}")

    async def measure_raw(self, scenario: Scenario, plan: RunPlan, tag: str, tick: Tick) -> Sample:
        return await measure_raw_sqlite(self._path(tag), self.synchronous, scenario, plan, tick)

    async def measure_ceiling(self, scenario: Scenario, plan: RunPlan, tick: Tick) -> Sample:
        raise NotImplementedError("sqlite has no pgbench")

    async def forget(self, tag: str) -> None:
        for path in self.workdir.glob(f"{tag}*.db*"):
            path.unlink(missing_ok=True)

    def settings(self) -> dict[str, object]:
        import sqlite3

        return {
            "journal_mode": "WAL",
            "synchronous": self.synchronous,
            "sqlite_version": sqlite3.sqlite_version,
        }


@dataclass(slots=True)
class PostgresBackend:
    """One PostgreSQL database at ``url`` for ours, the floor's tables and pgbench; the
    sharded stack's second shard is a sibling database created on first use."""

    url: str
    pgbench: str | None = None
    name: str = "postgres"
    options: Mapping[str, object] = field(default_factory=dict)
    _prepared: bool = field(default=False, init=False)
    _extra: dict[int, str] = field(default_factory=dict, init=False)
    _peers: dict[str, str] = field(default_factory=dict, init=False)
    _server: dict[str, object] = field(default_factory=dict, init=False)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme.lower()

    @property
    def raw_label(self) -> str | None:
        return None if raw_postgres.available() else "psycopg"

    @property
    def ceiling_label(self) -> str | None:
        return "pgbench" if self.pgbench else None

    def storage_url(self, tag: str) -> str:
        return self.url

    async def prepare(self) -> None:
        """Create the floor's tables and read the server settings (once)."""
        if self._prepared:
            return
        await raw_postgres.prepare_raw_postgres(self.url)
        self._server = await raw_postgres.server_settings(self.url)
        self._prepared = True

    async def extra_url(self, tag: str, index: int) -> str:
        if index not in self._extra:
            parts = urlsplit(self.url)
            base = parts.path.lstrip("/") or "postgres"
            name = f"{base}_loom_bench_shard{index}"
            await raw_postgres.ensure_database(self.url, name)
            self._extra[index] = urlunsplit(parts._replace(path=f"/{name}"))
        return self._extra[index]

    async def peer_url(self, peer: str) -> str:
        """The database of a peer system (``<database>_loom_bench_<peer>``) on the same
        server, created on first use; settled after every run like ours."""
        if peer not in self._peers:
            parts = urlsplit(self.url)
            base = parts.path.lstrip("/") or "postgres"
            name = f"{base}_loom_bench_{peer}"
            await raw_postgres.ensure_database(self.url, name)
            self._peers[peer] = urlunsplit(parts._replace(path=f"/{name}"))
        return self._peers[peer]

    async def measure_raw(self, scenario: Scenario, plan: RunPlan, tag: str, tick: Tick) -> Sample:
        await self.prepare()
        return await raw_postgres.measure_raw_postgres(self.url, scenario, plan, tick)

    async def measure_ceiling(self, scenario: Scenario, plan: RunPlan, tick: Tick) -> Sample:
        if not self.pgbench:
            raise NotImplementedError("pgbench was not found")
        await self.prepare()
        run = PgbenchRun(self.pgbench, self.url, threads=os.cpu_count() or 1)
        return await measure_pgbench(run, scenario, plan, tick)

    async def forget(self, tag: str) -> None:
        checkpointed = True
        for url in self._peers.values():
            await raw_postgres.settle_database(url)
        for url in (self.url, *self._extra.values()):
            checkpointed = await raw_postgres.settle(url) and checkpointed
        self._server["checkpoint_between_runs"] = checkpointed

    def settings(self) -> dict[str, object]:
        return {"pgbench": self.pgbench, **self._server}
