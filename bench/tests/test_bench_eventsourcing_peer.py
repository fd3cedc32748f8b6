"""eventsourcing beside the stream rows: its recorders write what the rows say they write
(read back through eventsourcing itself), on SQLite and on a real PostgreSQL server, with
the durability settings the report prints; and the runner puts them beside ours, or says
what to install."""

from __future__ import annotations

import importlib.util
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import ApplicationRecorder, IntegrityError
from loom_bench import runner
from loom_bench.cli import build_parser, config_from
from loom_bench.drive import RunPlan
from loom_bench.eventsourcing_peer import (
    EVENTSOURCING_INSTALL,
    RECORDERS,
    Peer,
    PostgresPeer,
    RecorderKind,
    SqlitePeer,
    eventsourcing_missing,
    run_eventsourcing,
)
from loom_bench.eventsourcing_recorders import opened_recorder, stored_events
from loom_bench.report_json import to_json_data
from loom_bench.report_markdown import render_markdown
from loom_bench.runner import BenchConfig, run_benchmark
from loom_bench.scenarios import EventTemplate
from loom_bench.streams import STREAMS, write_stream, write_stream_setup
from loom_bench.targets import evaluate
from loom_conformance.postgres import PostgresServer

from loom_core import ConflictError, Storage, open_storage
from loom_core.memory import open_memory
from loom_core.spi import BackendRegistry, PluginHost, hookimpl


@pytest.fixture(params=["sqlite", "postgres"])
def peer(request: pytest.FixtureRequest, tmp_path: Path) -> Peer:
    """eventsourcing on a fresh SQLite file, or on a fresh database of the session's
    PostgreSQL server."""
    if request.param == "sqlite":
        return SqlitePeer(tmp_path / "eventsourcing.db")
    server: PostgresServer = request.getfixturevalue("loom_postgres_server")
    return PostgresPeer(server.fresh_database("loom_bench_es"))


def _expected(templates: tuple[EventTemplate, ...]) -> list[tuple[int, str, object]]:
    return [(n, t.kind, t.payload) for n, t in enumerate(templates, start=1)]


def _read(peer: Peer, kind: RecorderKind, stream: str) -> list[tuple[int, str, object]]:
    """The stream as eventsourcing reads it back: (version, topic, decoded state)."""
    with opened_recorder(peer, kind, 1) as opened:
        return [
            (e.originator_version, e.topic, json.loads(e.state))
            for e in opened.recorder.select_events(stream)
        ]


@pytest.mark.parametrize("kind", RECORDERS)
def test_a_new_stream_is_three_events_at_versions_one_to_three(
    peer: Peer, kind: RecorderKind
) -> None:
    chosen = STREAMS["stream-new"]
    plan = RunPlan(executions=5, concurrency=2, warmup=2, prefix="new")
    ticks: list[int] = []
    run = run_eventsourcing(peer, kind, chosen, plan, lambda: ticks.append(1))
    assert run.sample.executions == 5
    assert len(ticks) == 5  # the warm-up is not counted
    for stream in [plan.execution_id(i) for i in range(5)] + [plan.warmup_id(0)]:
        assert _read(peer, kind, stream) == _expected(chosen.events)


@pytest.mark.parametrize("kind", RECORDERS)
def test_the_append_row_adds_exactly_one_event_at_the_next_version(
    peer: Peer, kind: RecorderKind
) -> None:
    chosen = STREAMS["stream-append"]
    plan = RunPlan(executions=4, concurrency=3, warmup=1, prefix="append")
    run = run_eventsourcing(peer, kind, chosen, plan, lambda: None)
    assert run.sample.executions == 4
    for index in range(4):
        log = _read(peer, kind, plan.execution_id(index))
        assert log == _expected((*chosen.setup, *chosen.events))
        assert len(log) == len(chosen.setup) + 1


@pytest.mark.parametrize("kind", RECORDERS)
def test_a_version_already_taken_is_refused_on_both_sides(
    peer: Peer, kind: RecorderKind
) -> None:
    """The rows compare writes that detect a conflict on each side."""
    chosen = STREAMS["stream-new"]
    with opened_recorder(peer, kind, 1) as opened:
        opened.recorder.insert_events(stored_events("s", chosen.events, 0))
        with pytest.raises(IntegrityError):
            opened.recorder.insert_events(stored_events("s", chosen.events[:1], 2))
    assert _read(peer, kind, "s") == _expected(chosen.events)


async def test_both_sides_write_the_same_kinds_and_payloads_at_the_same_positions() -> None:
    for chosen in STREAMS.values():
        async with open_storage("memory://") as storage:
            await write_stream_setup(storage.events, "s", chosen)
            await write_stream(storage.events, "s", chosen)
            ours = [(e.sequence + 1, e.kind, e.payload) for e in await storage.events.read("s")]
            with pytest.raises(ConflictError):
                await write_stream(storage.events, "s", chosen)
        theirs = [
            (s.originator_version, s.topic, json.loads(s.state))
            for s in (
                *stored_events("s", chosen.setup, 0),
                *stored_events("s", chosen.events, chosen.position),
            )
        ]
        assert ours == theirs == _expected((*chosen.setup, *chosen.events))


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_sqlite_durability_is_ours_and_read_back_from_its_own_connection(
    tmp_path: Path, synchronous: Any
) -> None:
    peer = SqlitePeer(tmp_path / "es.db", synchronous)
    with opened_recorder(peer, "application", 2) as opened:
        assert opened.durability == {"synchronous": synchronous, "journal_mode": "wal"}


def test_postgres_durability_is_read_back_from_the_server(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_bench_es")
    with psycopg.connect(url) as conn:
        fsync = conn.execute("SHOW fsync").fetchone()
        commit = conn.execute("SHOW synchronous_commit").fetchone()
    assert fsync is not None
    assert commit is not None
    with opened_recorder(PostgresPeer(url), "aggregate", 2) as opened:
        assert opened.durability == {"fsync": fsync[0], "synchronous_commit": commit[0]}


def test_an_unknown_recorder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="aggregate, application"), opened_recorder(
        SqlitePeer(tmp_path / "x.db"), "process", 1  # type: ignore[arg-type]
    ):
        pass


# -- through the runner ------------------------------------------------------------------------


class _OverMemory:
    """Registers ``scheme`` in-process with a memory store behind it: our side runs
    without the backend's plugin, eventsourcing's beside it on the real file or server."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme

    @staticmethod
    async def _open(url: str, options: Mapping[str, object]) -> Storage:
        return await open_memory("memory://", {})

    @hookimpl
    def loom_register_backends(self, registry: BackendRegistry) -> None:
        registry.add_backend(self.scheme, self._open)


def _host(scheme: str) -> PluginHost:
    host = PluginHost(entry_points=False)
    host.register(_OverMemory(scheme), name=f"{scheme}-over-memory")
    return host


async def test_the_runner_interleaves_both_recorders_with_ours_in_every_repetition(
    tmp_path: Path,
) -> None:
    config = BenchConfig(
        backends=("sqlite",), concurrency=(1, 3), executions=4, runs=2, warmup=1,
        scenarios=("stream-new", "stream-append"), workdir=tmp_path,
    )
    log = io.StringIO()
    result = await run_benchmark(config, plugins=_host("sqlite"), progress_stream=log)
    for key in ("stream-new", "stream-append"):
        for concurrency in (1, 3):
            row = result.row(f"sqlite/{key}@{concurrency}")
            assert row is not None
            assert row.status == "ok", row.note
            assert row.spec.kind == "stream"
            assert row.ours is not None
            assert row.raw is not None
            assert row.ceiling is not None
            assert (row.ours.label, row.raw.label, row.ceiling.label) == (
                "loom", "eventsourcing aggregate", "eventsourcing application"
            )
            for side in (row.ours, row.raw, row.ceiling):
                assert [s.executions for s in side.measured] == [4, 4]
            assert row.vs_raw is not None
            assert row.vs_raw.count == 2
            assert row.vs_ceiling is not None
            assert row.vs_ceiling.count == 2
    first = [line.split(" \u00b7 ")[-1].split(":")[0] for line in log.getvalue().splitlines()]
    assert first[:3] == ["loom", "eventsourcing aggregate", "eventsourcing application"]
    assert first[-3:] == ["eventsourcing application", "eventsourcing aggregate", "loom"]
    settings = result.settings["sqlite"]
    assert settings["eventsourcing_synchronous"] == "NORMAL"
    assert settings["eventsourcing_journal_mode"] == "wal"
    checks = [c for c in evaluate(result) if c.name == "vs-eventsourcing"]
    assert len(checks) == 2 * 2 * 2  # rows x concurrencies x recorders
    assert all(c.measured is not None and c.measured.count == 2 for c in checks)
    data = to_json_data(result)
    rows: Any = data["rows"]
    assert {row["kind"] for row in rows} == {"stream"}
    for row_data in rows:
        assert row_data["eventsourcing_aggregate"]["label"] == "eventsourcing aggregate"
        assert row_data["ours_over_eventsourcing_aggregate"]["count"] == 2
        assert row_data["ours_over_eventsourcing_application"]["count"] == 2
    markdown = render_markdown(result)
    assert "### sqlite: streams beside eventsourcing" in markdown
    assert "eventsourcing: journal_mode wal, synchronous NORMAL (read back" in markdown
    # Every side's file was removed after its run.
    assert list((tmp_path / "sqlite").iterdir()) == []


async def test_the_runner_writes_through_eventsourcing_on_the_same_postgres_server(
    tmp_path: Path, loom_postgres_server: PostgresServer
) -> None:
    url = loom_postgres_server.fresh_database("loom_bench_es")
    config = BenchConfig(
        backends=("postgres",), concurrency=(2,), executions=3, runs=2, warmup=1,
        scenarios=("stream-new",), postgres_url=url, workdir=tmp_path,
    )
    result = await run_benchmark(config, plugins=_host("postgresql"), show_progress=False)
    row = result.row("postgres/stream-new@2")
    assert row is not None
    assert row.status == "ok", row.note
    assert row.vs_raw is not None
    assert row.vs_ceiling is not None
    settings = result.settings["postgres"]
    assert settings["eventsourcing_fsync"] == settings["postgres_fsync"]
    assert settings["eventsourcing_synchronous_commit"] == settings["postgres_synchronous_commit"]
    # What the runs wrote, read back through eventsourcing from its own database: every
    # stream (warm-up and timed, two runs) is three events at versions 1-3.
    peer = PostgresPeer(f"{url}_loom_bench_eventsourcing")
    with opened_recorder(peer, "application", 1) as opened:
        assert isinstance(opened.recorder, ApplicationRecorder)
        notifications = opened.recorder.select_notifications(start=None, limit=1000)
    streams: dict[str, list[int]] = {}
    for n in notifications:
        streams.setdefault(str(n.originator_id), []).append(n.originator_version)
    assert len(streams) == 2 * (3 + 1)
    assert all(versions == [1, 2, 3] for versions in streams.values())


async def test_without_eventsourcing_its_sides_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "eventsourcing_missing", lambda: EVENTSOURCING_INSTALL)
    config = BenchConfig(
        backends=("sqlite",), concurrency=(2,), executions=3, runs=1, warmup=0,
        scenarios=("stream-new",), workdir=tmp_path,
    )
    result = await run_benchmark(config, plugins=_host("sqlite"), show_progress=False)
    row = result.row("sqlite/stream-new@2")
    assert row is not None
    assert row.status == "ok"
    assert row.ours is not None
    assert [s.executions for s in row.ours.measured] == [3]
    assert row.raw is not None
    assert row.ceiling is not None
    assert row.raw.note == row.ceiling.note == (
        "not installed: pip install 'loom-bench[eventsourcing]'"
    )
    markdown = render_markdown(result)
    assert "*not installed: pip install 'loom-bench[eventsourcing]'*" in markdown
    assert (
        "not measured: eventsourcing aggregate not installed: "
        "pip install 'loom-bench[eventsourcing]'"
    ) in markdown


def test_eventsourcing_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert eventsourcing_missing() is None
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "eventsourcing" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert eventsourcing_missing() == "pip install 'loom-bench[eventsourcing]'"


async def test_no_eventsourcing_runs_our_side_alone_and_judges_nothing(tmp_path: Path) -> None:
    args = build_parser().parse_args([
        "--backends", "memory,sqlite", "--scenarios", "stream-append", "--concurrency", "2",
        "--executions", "3", "--runs", "1", "--no-eventsourcing",
        "--workdir", str(tmp_path),
    ])
    config = config_from(args)
    assert config.eventsourcing is False
    result = await run_benchmark(config, plugins=_host("sqlite"), show_progress=False)
    for key in ("memory/stream-append@2", "sqlite/stream-append@2"):
        row = result.row(key)
        assert row is not None
        assert row.status == "ok"
        assert row.ours is not None
        assert [s.executions for s in row.ours.measured] == [3]
        assert (row.raw, row.ceiling) == (None, None)
    assert [c for c in evaluate(result) if c.name == "vs-eventsourcing"] == []
