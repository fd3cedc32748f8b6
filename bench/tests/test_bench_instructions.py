"""The instruction counter's parts that need no valgrind: the counted child run, the
arithmetic, the parsing, and a clear refusal without valgrind."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from loom_bench import instructions
from loom_bench.instructions import Count, Side, per_execution, run_executions

from loom_core import Storage, open_storage


@pytest.mark.parametrize("side", instructions.SIDES)
async def test_a_counted_run_completes_every_execution(
    monkeypatch: pytest.MonkeyPatch, side: Side
) -> None:
    opened: list[Storage] = []

    @contextlib.asynccontextmanager
    async def keep(url: str) -> AsyncIterator[Storage]:
        async with open_storage(url) as storage:
            opened.append(storage)
            yield storage
            ids = await storage.events.list_executions()
            assert sorted(ids) == sorted(f"{side}-{i}" for i in range(5))
            for execution_id in ids:
                kinds = [e.kind for e in await storage.events.read(execution_id)]
                assert kinds[-1] == "EXECUTION_COMPLETED"

    monkeypatch.setattr("loom_bench.instructions.open_storage", keep)
    await run_executions(side, "workflow-one-step", 5, "memory://")
    assert len(opened) == 1


def test_the_child_process_runs_the_twin_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loom_bench.instructions", "--child",
         "twin", "workflow-sleep", "3", "memory://"],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr


def test_one_execution_is_the_difference_over_the_difference_in_size() -> None:
    assert per_execution(200, 1200, 5_000_000, 105_000_000) == 100_000
    with pytest.raises(ValueError, match="small < large"):
        per_execution(10, 10, 1, 2)
    count = Count("workflow-one-step", "memory", runtime=800, twin=600, task=750, execute=700)
    assert (count.ratio, count.ceiling) == (0.75, 0.8)
    assert count.execute_ratio == 600 / 700


def test_valgrind_s_count_is_read_from_its_output() -> None:
    output = "==1== Events    : Ir\n==1== Collected : 123456789\n==1==\n"
    assert instructions._collected(output) == 123_456_789
    with pytest.raises(RuntimeError, match="no instruction count"):
        instructions._collected("valgrind: no such file")


def test_the_loop_threads_count_is_read_from_thread_ones_file(tmp_path: Path) -> None:
    out_file = tmp_path / "callgrind-runtime-100"
    (tmp_path / "callgrind-runtime-100-01").write_text(
        "version: 1\ncreator: callgrind\nthread: 1\nsummary: 4242\n\nfn=(1) x\n"
    )
    (tmp_path / "callgrind-runtime-100-02").write_text("thread: 2\nsummary: 99\n")
    assert instructions._loop_thread_count(out_file) == 4242
    with pytest.raises(RuntimeError, match="no count for the loop's thread"):
        instructions._loop_thread_count(tmp_path / "callgrind-twin-100")
    (tmp_path / "callgrind-twin-100-01").write_text("thread: 1\n")
    with pytest.raises(RuntimeError, match="no summary line"):
        instructions._loop_thread_count(tmp_path / "callgrind-twin-100")


def test_without_valgrind_the_count_is_refused_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("loom_bench.instructions.shutil.which", lambda _: None)
    with pytest.raises(RuntimeError, match="valgrind is not on PATH"):
        instructions.count_instructions("workflow-one-step", "memory")
