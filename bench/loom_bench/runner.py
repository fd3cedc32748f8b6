"""The benchmark: every row, every repetition, ours and its floors interleaved.

Order matters on a shared machine. Each repetition runs **every** row once (forwards on
even repetitions, backwards on odd ones) and, within a row, our run and the floors' runs
back to back (ours first on even repetitions, last on odd ones). So drift (another
process waking up, the disk cache filling) lands on both sides of every ratio, and the
ratios between rows (fenced over unfenced, conditional over unconditional) are paired
per repetition too.

A missing plugin, an unreachable server or a store that lacks a method the scenario needs
is a row status, never a crash; a run that raises marks its row failed with the error and
the benchmark goes on. A workflow row's sides are the runtime (``ours``), the store making
the same calls (``raw``, its floor) and, on PostgreSQL for the one-step workflow, DBOS
(``ceiling``, its peer); without loom-runtime the row, and without DBOS its peer side,
says "not installed" and what to install. A stream row's sides are our store (``ours``)
and, on SQLite and PostgreSQL, eventsourcing's aggregate recorder (``raw``) and
application recorder (``ceiling``), both "not installed" without eventsourcing.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TextIO

from loom_bench import machine
from loom_bench.backends import Backend, MemoryBackend, PostgresBackend, SqliteBackend
from loom_bench.dbos_peer import DBOS_LABEL, dbos_missing, measure_dbos
from loom_bench.drive import RunPlan
from loom_bench.eventsourcing_peer import (
    EVENTSOURCING_LABEL,
    Peer,
    PostgresPeer,
    RecorderKind,
    SqlitePeer,
    eventsourcing_missing,
    measure_eventsourcing,
    recorder_label,
)
from loom_bench.loom_runs import NotOffered, measure_loom
from loom_bench.pgbench import find_pgbench
from loom_bench.progress import Progress
from loom_bench.raw_sqlite import Synchronous
from loom_bench.results import (
    BenchResult,
    Parameters,
    RowKind,
    RowResult,
    RowSpec,
    SideResult,
    Status,
)
from loom_bench.scenarios import SCENARIOS, Scenario, scenario
from loom_bench.servers import ServerUnavailable, postgres_server
from loom_bench.stacks import missing_decorator
from loom_bench.statistics import Sample, paired_ratios
from loom_bench.streams import STREAMS, StreamScenario, measure_loom_stream, stream_scenario
from loom_bench.workflows import (
    WORKFLOWS,
    WorkflowCall,
    WorkflowScenario,
    check_workflow_call,
    measure_workflow,
    runtime_executor,
    runtime_missing,
    twin_executor,
    workflow_scenario,
)
from loom_core.spi import PluginHost, default_plugins

__all__ = ["BenchConfig", "run_benchmark"]

Side = Literal["ours", "raw", "ceiling"]
RUNTIME_LABEL = "runtime"
TWIN_LABEL = "store"
ALL_ROWS = (*SCENARIOS, *WORKFLOWS, *STREAMS)
"""Every row a benchmark can run, in the table's order."""
# A stream row's eventsourcing sides, by the side they take in a row.
_RECORDER_SIDES: dict[Side, RecorderKind] = {"raw": "aggregate", "ceiling": "application"}

AnyScenario = Scenario | WorkflowScenario | StreamScenario


def known_scenario(key: str) -> AnyScenario:
    """The store scenario, workflow or stream row named ``key``; refuses an unknown name."""
    chosen = workflow_scenario(key) or stream_scenario(key)
    if chosen is not None:
        return chosen
    try:
        return scenario(key)
    except ValueError:
        raise ValueError(f"unknown scenario {key!r}; known: {', '.join(ALL_ROWS)}") from None


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything the command line decides."""

    backends: tuple[str, ...] = ("memory", "sqlite", "postgres")
    concurrency: tuple[int, ...] = (64,)
    executions: int = 3000
    runs: int = 5
    warmup: int = 300
    scenarios: tuple[str, ...] = ALL_ROWS
    stacks: tuple[tuple[str, ...], ...] = ()
    stack_scenario: str = "short"
    sqlite_synchronous: Synchronous = "NORMAL"
    workflow_call: WorkflowCall = "start"
    postgres_url: str | None = None
    pgbench: str | None = None
    raw: bool = True
    ceiling: bool = True
    peer: bool = True
    eventsourcing: bool = True
    workdir: Path | None = None

    def __post_init__(self) -> None:
        if self.executions < 1 or self.runs < 1 or self.warmup < 0:
            raise ValueError("executions and runs must be at least 1, warmup at least 0")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError("concurrency must be one or more integers of at least 1")
        for key in self.scenarios:
            known_scenario(key)
        check_workflow_call(self.workflow_call, "workflow_call")
        scenario(self.stack_scenario)


@dataclass(slots=True)
class _Row:
    """A row while it is being measured (the mutable twin of RowResult)."""

    spec: RowSpec
    scenario: AnyScenario
    backend: Backend | None
    runs: int
    status: Status = "ok"
    note: str | None = None
    sides: dict[Side, list[Sample | None]] = field(default_factory=dict)
    labels: dict[Side, str] = field(default_factory=dict)
    errors: dict[Side, str] = field(default_factory=dict)
    missing: dict[Side, tuple[str, str]] = field(default_factory=dict)
    """Sides that are not run, by label and why (``not installed: ...``)."""

    def enable(self, side: Side, label: str | None) -> None:
        if label is not None:
            self.sides[side] = [None] * self.runs
            self.labels[side] = label

    def active_sides(self, repetition: int) -> list[Side]:
        order: list[Side] = [s for s in ("ours", "raw", "ceiling") if s in self.sides]
        order = [s for s in order if s not in self.errors]
        return order if repetition % 2 == 0 else order[::-1]

    def side_result(self, side: Side) -> SideResult | None:
        if side in self.missing:
            label, why = self.missing[side]
            return SideResult(label, (None,) * self.runs, note=why)
        if side not in self.sides:
            return None
        return SideResult(self.labels[side], tuple(self.sides[side]), self.errors.get(side))


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _kind(chosen: AnyScenario) -> RowKind:
    if isinstance(chosen, WorkflowScenario):
        return "workflow"
    return "stream" if isinstance(chosen, StreamScenario) else "store"


def _specs(config: BenchConfig) -> list[tuple[RowSpec, AnyScenario]]:
    specs: list[tuple[RowSpec, AnyScenario]] = []
    for backend in config.backends:
        for concurrency in config.concurrency:
            keys = list(config.scenarios)
            if config.stacks and config.stack_scenario not in keys:
                keys.append(config.stack_scenario)  # the stacks' undecorated baseline
            for key in keys:
                chosen = known_scenario(key)
                specs.append(
                    (RowSpec(backend, key, chosen.title, (), concurrency, _kind(chosen)), chosen)
                )
            stack_scenario = scenario(config.stack_scenario)
            for stack in config.stacks:
                specs.append(
                    (
                        RowSpec(
                            backend, stack_scenario.key, stack_scenario.title, stack,
                            concurrency,
                        ),
                        stack_scenario,
                    )
                )
    return specs


async def run_benchmark(
    config: BenchConfig,
    *,
    plugins: PluginHost | None = None,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
    command: str = "",
) -> BenchResult:
    """Run the benchmark ``config`` describes and return every sample."""
    host = plugins if plugins is not None else default_plugins()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    machine_info = machine.collect()
    session = secrets.token_hex(3)
    async with contextlib.AsyncExitStack() as stack:
        workdir = config.workdir
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="loom-bench-"))
            stack.callback(shutil.rmtree, workdir, True)
        backends, unavailable, postgres_origin = await _backends(config, host, workdir, stack)
        rows: list[_Row] = []
        for spec, chosen in _specs(config):
            backend = backends.get(spec.backend)
            row = _Row(spec, chosen, backend, config.runs)
            if backend is None:
                row.status, row.note = unavailable[spec.backend]
            elif (missing := missing_decorator(spec.stack, host)) is not None:
                row.status, row.note = "not installed", missing
            elif isinstance(chosen, WorkflowScenario):
                _enable_workflow(row, chosen, backend, config)
            elif isinstance(chosen, StreamScenario):
                _enable_stream(row, backend, config)
            else:
                row.enable("ours", "loom")
                if config.raw:
                    row.enable("raw", backend.raw_label)
                if config.ceiling and not spec.stack:
                    row.enable("ceiling", backend.ceiling_label)
            rows.append(row)
        total = sum(len(r.sides) for r in rows if r.status == "ok") * config.runs
        read_back: dict[str, dict[str, object]] = {}
        async with Progress(total, stream=progress_stream, enabled=show_progress) as progress:
            indexed = list(enumerate(rows))
            for repetition in range(config.runs):
                order = indexed if repetition % 2 == 0 else indexed[::-1]
                for index, row in order:
                    await _measure_row(
                        row, index, repetition, config, host, session, progress, read_back
                    )
        settings = {
            name: {**backend.settings(), **read_back.get(name, {})}
            for name, backend in backends.items()
        }
    machine_info = {**machine_info, "load_average_after": machine.load_average()}
    results = _results(rows)
    parameters = Parameters(
        backends=config.backends,
        concurrency=config.concurrency,
        executions=config.executions,
        runs=config.runs,
        warmup=config.warmup,
        scenarios=config.scenarios,
        stacks=config.stacks,
        stack_scenario=config.stack_scenario,
        sqlite_synchronous=config.sqlite_synchronous,
        workflow_call=config.workflow_call,
        postgres=postgres_origin,
        command=command,
    )
    return BenchResult(
        parameters=parameters,
        machine=machine_info,
        settings=settings,
        rows=results,
        started_at=started_at,
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _enable_workflow(
    row: _Row, chosen: WorkflowScenario, backend: Backend, config: BenchConfig
) -> None:
    """The runtime and its twin; DBOS beside them where it has the same workflow."""
    missing = runtime_missing()
    if missing is not None:
        row.status, row.note = "not installed", f"loom-runtime: {missing}"
        return
    row.enable("ours", RUNTIME_LABEL)
    row.enable("raw", TWIN_LABEL)
    if not (chosen.peer and config.peer and isinstance(backend, PostgresBackend)):
        return
    absent = dbos_missing()
    if absent is None:
        row.enable("ceiling", DBOS_LABEL)
    else:
        row.missing["ceiling"] = (DBOS_LABEL, f"not installed: {absent}")


def _enable_stream(row: _Row, backend: Backend, config: BenchConfig) -> None:
    """Our store; eventsourcing's two recorders beside it on SQLite and PostgreSQL."""
    row.enable("ours", "loom")
    if not config.eventsourcing or not isinstance(backend, SqliteBackend | PostgresBackend):
        return
    absent = eventsourcing_missing()
    for side, kind in _RECORDER_SIDES.items():
        if absent is None:
            row.enable(side, recorder_label(kind))
        else:
            row.missing[side] = (recorder_label(kind), f"not installed: {absent}")


async def _backends(
    config: BenchConfig,
    host: PluginHost,
    workdir: Path,
    stack: contextlib.AsyncExitStack,
) -> tuple[dict[str, Backend], dict[str, tuple[Status, str]], str]:
    """The reachable backends, and for the others the status and note their rows get."""
    backends: dict[str, Backend] = {}
    unavailable: dict[str, tuple[Status, str]] = {}
    origin = "not requested"
    installed = host.backends.factories
    for name in config.backends:
        candidate: Backend
        if name == "memory":
            candidate = MemoryBackend()
        elif name == "sqlite":
            candidate = SqliteBackend(workdir / "sqlite", config.sqlite_synchronous)
        elif name == "postgres":
            if "postgresql" not in installed and "postgres" not in installed:
                unavailable[name] = ("not installed", _not_installed("postgresql", host))
                continue
            try:
                url, origin = await stack.enter_async_context(
                    postgres_server(config.postgres_url)
                )
            except ServerUnavailable as exc:
                unavailable[name] = ("unavailable", str(exc))
                origin = "unavailable"
                continue
            candidate = PostgresBackend(url, find_pgbench(config.pgbench))
        else:
            raise ValueError(f"unknown backend {name!r}; known: memory, sqlite, postgres")
        if candidate.scheme not in installed:
            unavailable[name] = ("not installed", _not_installed(candidate.scheme, host))
            continue
        try:
            await candidate.prepare()
        except Exception as exc:
            unavailable[name] = ("unavailable", _describe(exc))
            continue
        backends[name] = candidate
    return backends, unavailable, origin


def _not_installed(scheme: str, host: PluginHost) -> str:
    """A short note: what to install, or why the installed plugin did not load."""
    try:
        host.backend_for(scheme)
    except Exception as exc:
        hint = host.backend_distribution(scheme)
        loaded_badly = any(scheme in str(error) for error in host.errors)
        if hint and not loaded_badly:
            return f"pip install {hint}"
        return str(exc)
    return f"no plugin registers {scheme}://"


async def _measure_row(
    row: _Row,
    index: int,
    repetition: int,
    config: BenchConfig,
    host: PluginHost,
    session: str,
    progress: Progress,
    read_back: dict[str, dict[str, object]],
) -> None:
    if row.status != "ok" or row.backend is None:
        return
    backend = row.backend
    spec = row.spec
    for side in row.active_sides(repetition):
        tag = f"{session}-r{repetition}-{index}-{side}"
        plan = RunPlan(config.executions, spec.concurrency, config.warmup, prefix=tag)
        progress.start_run(
            f"{spec.backend} · {spec.label} · C={spec.concurrency} · {row.labels[side]}",
            config.executions,
        )
        try:
            chosen = row.scenario
            if isinstance(chosen, WorkflowScenario):
                sample = await _measure_workflow_side(
                    side, backend, chosen, plan, tag, progress, host, config.workflow_call
                )
            elif isinstance(chosen, StreamScenario):
                sample, settings = await _measure_stream_side(
                    side, backend, chosen, plan, tag, progress, host
                )
                read_back.setdefault(spec.backend, {}).update(settings)
            elif side == "ours":
                sample = await measure_loom(
                    backend, spec.stack, chosen, plan, tag, progress.tick, host
                )
            elif side == "raw":
                sample = await backend.measure_raw(chosen, plan, tag, progress.tick)
            else:
                sample = await backend.measure_ceiling(chosen, plan, progress.tick)
        except NotOffered as exc:
            row.status, row.note = "unsupported", str(exc)
            progress.finish_run(f"unsupported: {exc}")
            return
        except Exception as exc:
            progress.finish_run(f"failed: {_describe(exc)}")
            if side == "ours":
                row.status, row.note = "failed", _describe(exc)
                return
            row.errors[side] = _describe(exc)
            continue
        finally:
            await _forget(backend, tag, row)
        if row.status != "ok":
            progress.finish_run(f"failed: {row.note}")
            return
        row.sides[side][repetition] = sample
        progress.finish_run(f"{sample.per_second:,.0f}/s, p50 {sample.p50_ms:.1f} ms")


async def _measure_workflow_side(
    side: Side,
    backend: Backend,
    chosen: WorkflowScenario,
    plan: RunPlan,
    tag: str,
    progress: Progress,
    host: PluginHost,
    call: WorkflowCall,
) -> Sample:
    if side == "ours":
        return await measure_workflow(
            functools.partial(runtime_executor, call=call),
            backend, chosen, plan, tag, progress.tick, host,
        )
    if side == "raw":
        return await measure_workflow(
            twin_executor, backend, chosen, plan, tag, progress.tick, host
        )
    assert isinstance(backend, PostgresBackend)
    return await measure_dbos(await backend.peer_url(DBOS_LABEL), chosen, plan, progress.tick)


async def _measure_stream_side(
    side: Side,
    backend: Backend,
    chosen: StreamScenario,
    plan: RunPlan,
    tag: str,
    progress: Progress,
    host: PluginHost,
) -> tuple[Sample, dict[str, object]]:
    """One run of a stream row's side, and the durability settings it read back (keys
    ``loom_*`` or ``eventsourcing_*``, for the report)."""
    if side == "ours":
        sample = await measure_loom_stream(backend, chosen, plan, tag, progress.tick, host)
        journal = backend.journal_mode(tag) if isinstance(backend, SqliteBackend) else None
        return sample, {} if journal is None else {"loom_journal_mode": journal}
    peer: Peer
    if isinstance(backend, SqliteBackend):
        peer = SqlitePeer(backend.database_file(tag), backend.synchronous)
    else:
        assert isinstance(backend, PostgresBackend)
        peer = PostgresPeer(await backend.peer_url(EVENTSOURCING_LABEL))
    run = await measure_eventsourcing(peer, _RECORDER_SIDES[side], chosen, plan, progress.tick)
    return run.sample, {f"eventsourcing_{key}": value for key, value in run.durability.items()}


async def _forget(backend: Backend, tag: str, row: _Row) -> None:
    """Clear run ``tag``'s traces; a failure fails the row rather than the benchmark, and
    no later run of it is measured on what was left behind."""
    try:
        await backend.forget(tag)
    except Exception as exc:
        row.status, row.note = "failed", f"clearing after a run: {_describe(exc)}"


def _results(rows: Sequence[_Row]) -> tuple[RowResult, ...]:
    by_key = {row.spec.key: row for row in rows}
    results = []
    for row in rows:
        ours = row.side_result("ours")
        vs_bare = None
        bare = by_key.get(row.spec.bare_key or "")
        if ours is not None and bare is not None and bare.status == "ok":
            bare_ours = bare.side_result("ours")
            if bare_ours is not None:
                vs_bare = paired_ratios(ours.per_second(), bare_ours.per_second())
        note = row.note
        if row.status == "ok" and row.errors:
            note = "; ".join(f"{row.labels[s]} failed: {e}" for s, e in row.errors.items())
        results.append(
            RowResult(
                spec=row.spec,
                status=row.status,
                note=note,
                ours=ours if row.status == "ok" else None,
                raw=row.side_result("raw") if row.status == "ok" else None,
                ceiling=row.side_result("ceiling") if row.status == "ok" else None,
                vs_bare=vs_bare,
            )
        )
    return tuple(results)
