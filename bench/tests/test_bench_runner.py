"""The runner, end to end with tiny counts: statuses, interleaving, the command."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from loom_bench.backends import MemoryBackend
from loom_bench.cli import main, redact
from loom_bench.runner import BenchConfig, run_benchmark

from loom_core import Storage
from loom_core.memory import open_memory
from loom_core.spi import BackendRegistry, PluginHost, hookimpl


class SqliteSchemeOverMemory:
    """Registers ``sqlite`` in-process with a memory store behind it, so the runner's
    SQLite rows (ours, and the real sqlite3 floor beside them) run without loom-sqlite."""

    @staticmethod
    async def _open(url: str, options: Mapping[str, object]) -> Storage:
        return await open_memory("memory://", {})

    @hookimpl
    def loom_register_backends(self, registry: BackendRegistry) -> None:
        registry.add_backend("sqlite", self._open)


def _config(tmp_path: Path, **overrides: object) -> BenchConfig:
    settings: dict[str, object] = {
        "backends": ("memory", "sqlite"),
        "concurrency": (3,),
        "executions": 6,
        "runs": 2,
        "warmup": 1,
        "scenarios": ("short", "park-resume-fence-if"),
        "workdir": tmp_path,
        **overrides,
    }
    return BenchConfig(**settings)  # type: ignore[arg-type]


async def test_a_backend_not_installed_is_a_row_status_not_a_crash(tmp_path: Path) -> None:
    result = await run_benchmark(
        _config(tmp_path, stacks=(("tenant",),)),
        plugins=PluginHost(entry_points=False), show_progress=False,
    )
    by_key = {row.spec.key: row for row in result.rows}
    sqlite = by_key["sqlite/short@3"]
    assert sqlite.status == "not installed"
    assert sqlite.note == "pip install loom-sqlite"
    memory = by_key["memory/short@3"]
    assert memory.status == "ok"
    assert memory.ours is not None
    assert [s.executions for s in memory.ours.measured] == [6, 6]
    assert memory.raw is None  # memory has no raw floor
    tenant = by_key["memory/short+tenant@3"]
    assert tenant.status == "not installed"
    assert tenant.note == "decorator 'tenant' not installed (pip install loom-tenant)"


async def test_a_store_without_the_method_makes_its_row_unsupported(tmp_path: Path) -> None:
    limited = PluginHost(entry_points=False)

    class NoOptionalMethods:
        @hookimpl
        def loom_register_backends(self, registry: BackendRegistry) -> None:
            async def factory(url: str, options: Mapping[str, object]) -> Storage:
                return await open_memory("memory://", {"offer": ()})

            registry.add_backend("sqlite", factory)

    limited.register(NoOptionalMethods(), name="limited")
    result = await run_benchmark(
        _config(tmp_path, backends=("sqlite",)), plugins=limited, show_progress=False
    )
    by_key = {row.spec.key: row for row in result.rows}
    assert by_key["sqlite/short@3"].status == "ok"
    unsupported = by_key["sqlite/park-resume-fence-if@3"]
    assert unsupported.status == "unsupported"
    assert unsupported.note == "the store does not offer acquire_fence_if"


async def test_ours_and_the_raw_floor_alternate_in_every_repetition(tmp_path: Path) -> None:
    host = PluginHost(entry_points=False)
    host.register(SqliteSchemeOverMemory(), name="sqlite-over-memory")
    log = io.StringIO()
    result = await run_benchmark(
        _config(tmp_path, backends=("sqlite",), scenarios=("short",)),
        plugins=host, progress_stream=log, show_progress=True,
    )
    row = result.rows[0]
    assert row.status == "ok"
    assert row.raw is not None
    assert row.raw.label == "sqlite3"
    assert [s.executions for s in row.raw.measured] == [6, 6]
    assert row.vs_raw is not None
    assert row.vs_raw.count == 2
    # Not a terminal: one line per finished run, in the order they ran.
    sides = [line.split(" \u00b7 ")[-1].split(":")[0] for line in log.getvalue().splitlines()]
    assert sides == ["loom", "sqlite3", "sqlite3", "loom"]
    # Each run had its own file, removed after it.
    assert list((tmp_path / "sqlite").iterdir()) == []


async def test_stack_rows_bring_their_undecorated_baseline(tmp_path: Path) -> None:
    config = _config(
        tmp_path, backends=("memory",), scenarios=("park-resume",), stacks=(("nope",),)
    )
    result = await run_benchmark(
        config, plugins=PluginHost(entry_points=False), show_progress=False
    )
    assert [row.spec.key for row in result.rows] == [
        "memory/park-resume@3", "memory/short@3", "memory/short+nope@3",
    ]


def test_the_command_prints_markdown_and_writes_both_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_md = tmp_path / "out.json", tmp_path / "out.md"
    code = main([
        "--backends", "memory", "--executions", "4", "--runs", "1", "--concurrency", "2",
        "--scenarios", "short", "--no-progress", "--json", str(out_json),
        "--markdown", str(out_md),
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed == out_md.read_text()
    assert "### memory" in printed
    data = json.loads(out_json.read_text())
    assert data["rows"][0]["key"] == "memory/short@2"
    assert data["parameters"]["command"].startswith("python3 -m bench --backends memory")


def test_a_password_in_a_url_never_reaches_the_report() -> None:
    assert redact("postgresql://bench:s3cret@db:5432/loom") == "postgresql://bench:***@db:5432/loom"
    assert redact("postgresql://bench@db/loom") == "postgresql://bench@db/loom"


def test_two_reports_are_compared_row_by_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = []
    for name in ("before", "after"):
        path = tmp_path / f"{name}.json"
        assert main([
            "--backends", "memory", "--executions", "3", "--runs", "1", "--concurrency", "1",
            "--scenarios", "short", "--no-progress", "--json", str(path),
        ]) == 0
        reports.append(str(path))
    capsys.readouterr()
    assert main(["--compare", *reports]) == 0
    table = capsys.readouterr().out
    assert "| memory/short@1 |" in table
    assert "executions/s before" in table


def test_comparing_a_file_that_is_not_a_report_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"schema": "something-else"}')
    with pytest.raises(SystemExit) as exit_info:
        main(["--compare", str(other), str(other)])
    assert exit_info.value.code == 2


async def test_a_run_whose_traces_cannot_be_cleared_fails_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def cannot_clear(self: MemoryBackend, tag: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(MemoryBackend, "forget", cannot_clear)
    result = await run_benchmark(
        _config(tmp_path, backends=("memory",), scenarios=("short",)),
        plugins=PluginHost(entry_points=False),
        show_progress=False,
    )
    (row,) = result.rows
    assert row.status == "failed"
    assert row.note == "clearing after a run: OSError: disk gone"
    assert row.ours is None  # no figure from a run measured on what another left behind
