"""The workflow rows: the twin makes the runtime's store calls, call for call; the rows,
their ratios and DBOS beside them (or "not installed") reach the report."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from loom_bench import runner
from loom_bench.backends import PostgresBackend
from loom_bench.dbos_peer import DBOS_INSTALL, dbos_missing, measure_dbos
from loom_bench.drive import RunPlan
from loom_bench.report_markdown import render_markdown
from loom_bench.runner import BenchConfig, run_benchmark
from loom_bench.workflows import (
    WORKFLOW_CALLS,
    WORKFLOWS,
    WorkflowCall,
    WorkflowScenario,
    run_twin,
    runtime_executor,
)
from loom_runtime import Loom

from loom_core import Event, Storage, open_storage
from loom_core.memory import open_memory
from loom_core.spi import BackendRegistry, PluginHost, hookimpl

Call = tuple[object, ...]


class _Recording:
    """Forwards every call to ``inner`` and records what a store would see of it: the
    method, the sequence and fence it was given, and the kinds and keys it wrote."""

    def __init__(self, inner: Any, store: str, calls: list[Call]) -> None:
        self._inner = inner
        self._store = store
        self._calls = calls

    @property
    def capabilities(self) -> Any:
        return self._inner.capabilities

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if name.startswith("_") or not callable(method) or name == "subscribe":
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(self._describe(name, args, kwargs))
            return await method(*args, **kwargs)

        return call

    def _describe(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        if name == "append":
            written = tuple((e.kind, tuple(sorted(_keys(e.payload)))) for e in args[1])
            return (self._store, name, kwargs["expected_sequence"], kwargs.get("fence"),
                    written)
        if self._store == "timers":
            return (self._store, name)
        return (self._store, name, *args[1:], *sorted(kwargs.items()))


def _keys(payload: object) -> list[str]:
    return list(payload) if isinstance(payload, dict) else []


@contextlib.asynccontextmanager
async def _recorded() -> AsyncIterator[tuple[Storage, list[Call]]]:
    calls: list[Call] = []
    async with open_storage("memory://") as inner:
        storage = Storage(
            _Recording(inner.events, "events", calls),
            _Recording(inner.timers, "timers", calls),
            inner.leases,
        )
        yield storage, calls


@pytest.mark.parametrize("call", WORKFLOW_CALLS)
@pytest.mark.parametrize("key", list(WORKFLOWS))
async def test_the_twin_makes_the_runtimes_store_calls_call_for_call(
    key: str, call: WorkflowCall, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = WORKFLOWS[key]
    other = "start" if call == "execute" else "execute"

    async def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"call={call!r} used app.{other}")

    monkeypatch.setattr(Loom, other, refused)
    async with _recorded() as (storage, runtime_calls):
        async with runtime_executor(storage, chosen, call) as execute:
            await execute("e-1")
        runtime_log = await storage.events.read("e-1")
        assert await storage.timers.pending("e-1") == ()
    async with _recorded() as (storage, twin_calls):
        await run_twin(storage, "e-1", chosen)
        twin_log = await storage.events.read("e-1")
        assert await storage.timers.pending("e-1") == ()
    assert twin_calls == runtime_calls
    assert _shape(twin_log) == _shape(runtime_log)
    assert len(runtime_log) == chosen.appends


def _shape(log: tuple[Event, ...]) -> list[tuple[int, str, int, list[str]]]:
    return [(e.sequence, e.kind, e.fence, sorted(_keys(e.payload))) for e in log]


def test_the_runtime_and_its_twin_write_the_listed_calls() -> None:
    """What the docs say each row does, pinned: the sleep parks, resumes under token 1
    after a conditional acquire and a tail read, and retires its timer row."""
    sleep = WORKFLOWS["workflow-sleep"]
    assert sleep.requires == {"acquire_fence_if"}
    assert {key: w.appends for key, w in WORKFLOWS.items()} == {
        "workflow-one-step": 3, "workflow-three-steps": 5, "workflow-sleep": 4,
    }
    assert [key for key, w in WORKFLOWS.items() if w.peer] == ["workflow-one-step"]


async def test_the_sleep_twin_calls_in_the_runtimes_order() -> None:
    async with _recorded() as (storage, calls):
        await run_twin(storage, "e-1", WORKFLOWS["workflow-sleep"])
    assert [call[:4] if call[0] == "events" else call for call in calls] == [
        ("events", "append", 0, 0),
        ("timers", "schedule"),
        ("events", "append", 1, 0),
        ("events", "acquire_fence_if", ("fence", 0), ("park_seq", 1)),
        ("events", "read", ("from_sequence", 2)),
        ("events", "append", 2, 1),
        ("timers", "complete"),
        ("events", "append", 3, 1),
        ("timers", "cancel"),
    ]


class _PostgresSchemeOverMemory:
    """Registers ``postgresql`` in-process with a memory store behind it, so the runner's
    PostgreSQL workflow rows (where DBOS would stand beside them) run without a server."""

    @staticmethod
    async def _open(url: str, options: Mapping[str, object]) -> Storage:
        return await open_memory("memory://", {})

    @hookimpl
    def loom_register_backends(self, registry: BackendRegistry) -> None:
        registry.add_backend("postgresql", self._open)


@contextlib.asynccontextmanager
async def _given(url: str | None) -> AsyncIterator[tuple[str, str]]:
    yield "postgresql://bench@127.0.0.1/none", "server given by --postgres-url"


async def _nothing(self: PostgresBackend, *args: object) -> None:
    return None


async def test_without_dbos_the_peer_side_says_not_installed_and_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "dbos_missing", lambda: DBOS_INSTALL)
    monkeypatch.setattr(runner, "postgres_server", _given)
    monkeypatch.setattr(PostgresBackend, "prepare", _nothing)
    monkeypatch.setattr(PostgresBackend, "forget", _nothing)
    host = PluginHost(entry_points=False)
    host.register(_PostgresSchemeOverMemory(), name="postgres-over-memory")
    config = BenchConfig(
        backends=("postgres",), concurrency=(64,), executions=4, runs=2, warmup=1,
        scenarios=("workflow-one-step", "workflow-three-steps"), workdir=tmp_path,
    )
    result = await run_benchmark(config, plugins=host, show_progress=False)
    one = result.row("postgres/workflow-one-step@64")
    assert one is not None
    assert one.status == "ok"
    assert one.ours is not None
    assert one.ours.label == "runtime"
    assert [s.executions for s in one.ours.measured] == [4, 4]
    assert one.raw is not None
    assert one.raw.label == "store"
    assert one.vs_raw is not None
    assert one.vs_raw.count == 2
    assert one.ceiling is not None
    assert one.ceiling.note == "not installed: pip install 'loom-bench[dbos]'"
    three = result.row("postgres/workflow-three-steps@64")
    assert three is not None
    assert three.ceiling is None  # DBOS runs the one-step workflow only
    markdown = render_markdown(result)
    assert "### postgres: workflows" in markdown
    assert "*not installed: pip install 'loom-bench[dbos]'*" in markdown
    assert "not measured: dbos not installed: pip install 'loom-bench[dbos]'" in markdown


async def test_the_workflow_call_reaches_the_runtime_side_and_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executed: list[str] = []
    execute = Loom.execute

    async def counted(self: Loom, workflow: Any, *args: Any, id: str | None = None) -> Any:
        executed.append(str(id))
        return await execute(self, workflow, *args, id=id)

    monkeypatch.setattr(Loom, "execute", counted)
    config = BenchConfig(
        backends=("memory",), concurrency=(2,), executions=4, runs=2, warmup=1,
        scenarios=("workflow-one-step",), workflow_call="execute", workdir=tmp_path,
    )
    result = await run_benchmark(
        config, plugins=PluginHost(entry_points=False), show_progress=False
    )
    row = result.row("memory/workflow-one-step@2")
    assert row is not None
    assert row.status == "ok"
    assert len(executed) == 2 * (4 + 1)  # every execution of the runtime side, warm-ups too
    assert result.parameters.workflow_call == "execute"
    assert "(`app.execute`, the body in the calling task)" in render_markdown(result)
    with pytest.raises(ValueError, match="workflow_call must be one of start, execute"):
        BenchConfig(workflow_call="run")  # type: ignore[arg-type]


def test_dbos_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "dbos" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert dbos_missing() == "pip install 'loom-bench[dbos]'"


async def test_without_the_runtime_the_workflow_rows_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "runtime_missing", lambda: "pip install -e runtime")
    config = BenchConfig(
        backends=("memory",), concurrency=(2,), executions=2, runs=1, warmup=0,
        scenarios=("short", "workflow-sleep"), workdir=tmp_path,
    )
    result = await run_benchmark(
        config, plugins=PluginHost(entry_points=False), show_progress=False
    )
    row = result.row("memory/workflow-sleep@2")
    assert row is not None
    assert (row.status, row.note) == ("not installed", "loom-runtime: pip install -e runtime")
    short = result.row("memory/short@2")
    assert short is not None
    assert short.status == "ok"


async def test_a_workflow_row_on_a_store_without_the_conditional_acquire_is_unsupported(
    tmp_path: Path,
) -> None:
    class NoOptionalMethods:
        @hookimpl
        def loom_register_backends(self, registry: BackendRegistry) -> None:
            async def factory(url: str, options: Mapping[str, object]) -> Storage:
                return await open_memory("memory://", {"offer": ()})

            registry.add_backend("sqlite", factory)

    host = PluginHost(entry_points=False)
    host.register(NoOptionalMethods(), name="limited")
    config = BenchConfig(
        backends=("sqlite",), concurrency=(2,), executions=2, runs=1, warmup=0,
        scenarios=("workflow-one-step", "workflow-sleep"), workdir=tmp_path,
    )
    result = await run_benchmark(config, plugins=host, show_progress=False)
    by_key = {row.spec.key: row for row in result.rows}
    assert by_key["sqlite/workflow-one-step@2"].status == "ok"
    sleep = by_key["sqlite/workflow-sleep@2"]
    assert (sleep.status, sleep.note) == (
        "unsupported", "the store does not offer acquire_fence_if"
    )


async def test_dbos_runs_its_one_step_workflow_once_per_execution(tmp_path: Path) -> None:
    """On DBOS's SQLite system database (the rows use PostgreSQL; the driver is the same)."""
    if dbos_missing() is not None:
        pytest.skip(f"DBOS is not installed ({DBOS_INSTALL})")
    ticks: list[int] = []
    plan = RunPlan(executions=5, concurrency=2, warmup=1, prefix="d")
    url = f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    chosen: WorkflowScenario = WORKFLOWS["workflow-one-step"]
    sample = await measure_dbos(url, chosen, plan, lambda: ticks.append(1))
    assert sample.executions == 5
    assert len(ticks) == 5
    # A second run launches DBOS again over the same registry.
    again = await measure_dbos(url, chosen, RunPlan(2, 2, 0, prefix="e"), lambda: None)
    assert again.executions == 2
    # DBOS's destroy shuts down the pool it made the loop's default executor; the loop
    # has a working one again (the harness stops its PostgreSQL server through it).
    assert await asyncio.to_thread(lambda: "still runs") == "still runs"


async def test_dbos_refuses_a_workflow_it_has_no_equivalent_of() -> None:
    with pytest.raises(ValueError, match="no DBOS equivalent"):
        await measure_dbos(
            "sqlite:///unused", WORKFLOWS["workflow-sleep"], RunPlan(1, 1, 0, "x"), lambda: None
        )

