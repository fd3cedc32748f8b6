"""``python -m loom_runtime demo``: a worker killed mid-workflow, finished by another."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from loom_core import Event, EventKind, NewEvent, open_storage


def run_demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom_runtime", "demo", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def read_log(db: Path) -> tuple[Event, ...]:
    async with open_storage("sqlite:///" + str(db)) as storage:
        return await storage.events.read("demo")


def recorded_pid(event: Event) -> object:
    payload = event.payload
    assert isinstance(payload, dict)
    result = payload["result"]
    assert isinstance(result, dict)
    return result["pid"]


def test_the_demo_kills_its_worker_mid_workflow_and_the_restart_finishes_it(
    tmp_path: Path,
) -> None:
    for _ in range(2):  # the second run starts over on the same file
        done = run_demo(tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SIGKILL" in done.stdout
        assert "step-1 served from the log" in done.stdout
        assert "ok: 5 steps, each recorded once" in done.stdout

        log = asyncio.run(read_log(tmp_path / "loom-demo.db"))
        assert [e.sequence for e in log] == list(range(len(log)))
        kinds = [e.kind for e in log]
        assert kinds == [
            EventKind.EXECUTION_STARTED,
            EventKind.STEP_COMPLETED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_RECOVERED,
            EventKind.STEP_COMPLETED,
            EventKind.STEP_COMPLETED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_COMPLETED,
        ]
        # Steps 1-2 were recorded by the first process, 3-5 by the one that took over.
        pids = [recorded_pid(e) for e in log if e.kind == EventKind.STEP_COMPLETED]
        assert pids[0] == pids[1] != pids[2] == pids[3] == pids[4]
        # The first process died in step-3 after its effect: step-3 ran twice.
        trace = (tmp_path / "loom-demo.effects" / "trace.log").read_text().splitlines()
        assert [line.split()[0] for line in trace if line.endswith(" start")] == [
            "step-1",
            "step-2",
            "step-3",
            "step-3",
            "step-4",
            "step-5",
        ]


def test_the_demo_takes_the_file_and_the_step_count(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--db", str(tmp_path / "other.db"), "--steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    log = asyncio.run(read_log(tmp_path / "other.db"))
    assert [e.kind for e in log].count(EventKind.STEP_COMPLETED) == 2
    assert not (tmp_path / "loom-demo.db").exists()


def test_the_demo_refuses_a_step_count_below_one(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--steps", "0")
    assert done.returncode == 2
    assert "--steps" in done.stderr


def test_the_demo_deletes_only_what_an_earlier_demo_left(tmp_path: Path) -> None:
    """The demo deletes and recreates its database, so it refuses a path that holds
    anything else, and deletes nothing."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    effects = tmp_path / "notes.effects"
    effects.mkdir()
    (effects / "mine.txt").write_text("kept")
    for path, said in ((notes, "is not a SQLite database"), (fifo, "is not a regular file")):
        done = run_demo(tmp_path, "--db", str(path))
        assert done.returncode == 1, done.stdout + done.stderr
        assert said in done.stderr
    assert notes.read_text() == "not a database\n"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert (effects / "mine.txt").read_text() == "kept"

    theirs = tmp_path / "customers.sqlite"
    with sqlite3.connect(theirs) as connection:
        connection.execute("CREATE TABLE customers (name TEXT)")
    connection.close()
    done = run_demo(tmp_path, "--db", str(theirs))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "holds tables that are not Loom's (customers)" in done.stderr
    with sqlite3.connect(theirs) as connection:
        assert connection.execute("SELECT count(*) FROM customers").fetchone() == (0,)
    connection.close()

    orders = tmp_path / "orders.db"  # an app's own Loom database

    async def write_one() -> None:
        async with open_storage(f"sqlite:///{orders}") as storage:
            await storage.events.append(
                "order-1", [NewEvent("X", {})], expected_sequence=0
            )

    asyncio.run(write_one())
    done = run_demo(tmp_path, "--db", str(orders))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "holds executions other than the demo's (order-1)" in done.stderr
    assert orders.exists()

    done = run_demo(tmp_path, "--db", str(tmp_path / "missing" / "x.db"))
    assert done.returncode == 1
    assert "does not exist" in done.stderr
    assert not (tmp_path / "missing").exists()

    # A file of the demo's own is started afresh; what else its directory holds is kept.
    done = run_demo(tmp_path, "--db", str(tmp_path / "notes.db"), "--steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "notes.effects").rename(tmp_path / "kept")
    effects = tmp_path / "notes.effects"
    effects.mkdir()
    (effects / "mine.txt").write_text("kept")
    done = run_demo(tmp_path, "--db", str(tmp_path / "notes.db"), "--steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (effects / "mine.txt").read_text() == "kept"


def test_the_demo_refuses_a_database_named_as_its_traces_directory(tmp_path: Path) -> None:
    """``x.effects`` is where the traces of a database ``x.effects`` would go: the demo
    made that directory, then could not open the database it had become."""
    done = run_demo(tmp_path, "--db", str(tmp_path / "run.effects"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "is where the demo keeps its traces" in done.stderr
    assert not (tmp_path / "run.effects").exists()



def test_the_demo_writes_the_very_file_it_is_given_whatever_its_name(tmp_path: Path) -> None:
    """A file name is not URL text: ``%41`` must not lead the demo into ``A``, a file it
    never checked (here someone's database), nor ``?`` cut the name short."""
    theirs = tmp_path / "shopA.db"
    with sqlite3.connect(theirs) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER)")
    for name in ("shop%41.db", "shop?steps=1.db", "shop #1.db"):
        done = run_demo(tmp_path, "--db", str(tmp_path / name), "--steps", "2")
        assert done.returncode == 0, done.stdout + done.stderr
        log = asyncio.run(read_log_at(tmp_path / name))
        assert [e.kind for e in log].count(EventKind.STEP_COMPLETED) == 2
    with sqlite3.connect(theirs) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
    assert tables == ["orders"]


async def read_log_at(db: Path) -> tuple[Event, ...]:
    async with open_storage("sqlite:///" + quote(str(db))) as storage:
        return await storage.events.read("demo")
