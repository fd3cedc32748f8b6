"""``loom worker --app module:attribute``: serve an app until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from loom_runtime import Context, Loom
from loom_runtime.testing import crash_at

SERVED = """
import os
from loom_runtime import Context, Loom

app = Loom(os.environ["SERVED_URL"], node="w1")


def answer() -> int:
    return 42


@app.workflow(name="served")
async def served(ctx: Context) -> int:
    return await ctx.step(answer, name="served")
"""


def answer() -> int:
    return 42


def serve(
    directory: Path, url: str, source: str = SERVED, *options: str
) -> subprocess.Popen[str]:
    """``loom worker`` on ``served_app:app`` (``source``, written to ``directory``) over
    ``url``."""
    (directory / "served_app.py").write_text(source)
    return subprocess.Popen(
        [sys.executable, "-m", "loom_runtime", "worker", "--app", "served_app:app", *options],
        cwd=directory,
        env={**os.environ, "SERVED_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def left_running(url: str, workflow: str, execution_id: str, node: str = "w1") -> None:
    """An execution of ``workflow`` (one step, named as the workflow) left running under
    ``node`` with its step not run, as by a process that died: the worker's to recover."""
    left = Loom(url, node=node, recover=False)

    async def one_step(ctx: Context) -> int:
        return await ctx.step(answer, name=workflow)

    left.workflow(name=workflow)(one_step)
    async with left:
        crash = crash_at(left, step=workflow, when="before")
        await left.start(workflow, id=execution_id)
        await crash.fired.wait()
        await left.drain()


def written(marker: Path) -> bool:
    return marker.exists()  # a stat of a local file: nothing worth a thread


async def until_written(worker: subprocess.Popen[str], marker: Path) -> None:
    """Wait until the worker's app or step writes ``marker`` (the worker still alive)."""
    while not written(marker):
        assert worker.poll() is None, worker.communicate()
        await asyncio.sleep(0.05)


def finished(worker: subprocess.Popen[str]) -> str:
    """The worker's stderr once it has exited; killed if it has not within a minute (a
    guard against hanging the run, not a measure: each test's worker ends on its own)."""
    try:
        _, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    return stderr


async def test_the_worker_recovers_its_nodes_execution_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    url = "sqlite:///" + str(tmp_path / "served.db")
    await left_running(url, "served", "left-running")
    worker = serve(tmp_path, url)
    try:
        checker = Loom(url, node="checker", recover=False, timers=False)
        async with checker:
            assert await checker.get("left-running").result(timeout=60) == 42
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert "loom worker: node 'w1'" in stderr
    assert "stopped" in stderr


async def test_the_worker_serves_as_the_node_it_is_given_rather_than_the_apps(
    tmp_path: Path,
) -> None:
    """Two worker processes of one app module, each with its own --node: a restart of
    w2 recovers what w2 was running, which the app's own node (w1) would leave."""
    url = "sqlite:///" + str(tmp_path / "served.db")
    await left_running(url, "served", "left-by-w2", node="w2")
    worker = serve(tmp_path, url, SERVED, "--node", "w2")
    try:
        checker = Loom(url, node="checker", recover=False, timers=False)
        async with checker:
            assert await checker.get("left-by-w2").result(timeout=60) == 42
    finally:
        worker.send_signal(signal.SIGTERM)
        stderr = finished(worker)
    assert worker.returncode == 0, stderr
    assert "loom worker: node 'w2'" in stderr


# Bytes that are not UTF-8 reach the worker as lone surrogates, which no store can hold.
@pytest.mark.parametrize(
    ("node", "why"), [(b"", "must be a non-empty str"), (b"w\xff", "lone surrogate")]
)
def test_the_worker_refuses_a_node_name_an_event_cannot_hold(
    tmp_path: Path, node: bytes, why: str
) -> None:
    (tmp_path / "served_app.py").write_text(SERVED)
    result = subprocess.run(
        [sys.executable.encode(), b"-m", b"loom_runtime", b"worker",
         b"--app", b"served_app:app", b"--node", node],
        cwd=tmp_path,
        env={**os.environ, "SERVED_URL": "sqlite:///" + str(tmp_path / "served.db")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "Invalid value for --node" in result.stderr, result.stderr
    assert why in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "served.db").exists()  # refused before the storage opened


def test_the_worker_refuses_an_app_spec_that_is_not_a_loom(tmp_path: Path) -> None:
    (tmp_path / "not_an_app.py").write_text("app = 3\n")
    (tmp_path / "send_only.py").write_text(
        "from loom_runtime import Loom\napp = Loom('memory://', timers=False)\n"
    )
    for spec, says in (
        ("nocolon", "is not MODULE:ATTRIBUTE"),
        (".not_an_app:app", "is a relative module name"),
        ("..:app", "is a relative module name"),
        ("send_only:app", "is built with timers=False"),
        ("no_such_module:app", "cannot import 'no_such_module'"),
        ("not_an_app:missing", "has no attribute 'missing'"),
        ("not_an_app:app", "is of type int, not a loom_runtime.Loom"),
        ("orders/flows.py:app", "is a file path: give the module's dotted name"),
        ("flows.py:app", "(e.g. flows:app)"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "loom_runtime", "worker", "--app", spec],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (spec, done.stderr)
        assert says in done.stderr, (spec, done.stderr)


def test_the_worker_says_what_is_wrong_with_the_module_of_its_app_without_a_traceback(
    tmp_path: Path,
) -> None:
    """A module that does not compile, or that builds its app wrongly (Loom refuses an
    option or a registration with its own typed error), is named in one line, as a
    module that is not there is."""
    modules = {
        "broken_syntax": "def f(:\n",
        "empty_node": "from loom_runtime import Loom\napp = Loom('memory://', node='')\n",
        "twice": (
            "from loom_runtime import Context, Loom\n"
            "app = Loom('memory://')\n"
            "async def one(ctx: Context) -> None: ...\n"
            "async def other(ctx: Context) -> None: ...\n"
            "app.workflow(name='a')(one)\n"
            "app.workflow(name='a')(other)\n"
        ),
        "nested": "from loom_runtime import Loom\napp = Loom('memory://')\n",
    }
    for name, source in modules.items():
        (tmp_path / f"{name}.py").write_text(source)
    for spec, code, says in (
        ("broken_syntax:app", 2, "cannot import 'broken_syntax': invalid syntax"),
        ("empty_node:app", 1, "could not load empty_node:app: Loom(node=...) must be"),
        ("twice:app", 1, "a workflow named 'a' is already registered"),
        ("nested:app.missing", 2, "'nested.app' has no attribute 'missing'"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "loom_runtime", "worker", "--app", spec],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == code, (spec, done.stderr)
        assert says in done.stderr, (spec, done.stderr)
        assert "Traceback" not in done.stderr, (spec, done.stderr)


def test_the_worker_says_why_its_storage_did_not_open_without_a_traceback(
    tmp_path: Path,
) -> None:
    for url, says in (
        ("bogus://x", "bogus"),
        (f"sqlite:///{tmp_path}/no/such/dir/x.db", "no/such/dir"),
    ):
        worker = serve(tmp_path, url)
        _, stderr = worker.communicate(timeout=60)
        assert worker.returncode == 1, stderr
        assert "the worker could not serve served_app:app" in stderr, stderr
        assert says in stderr, stderr
        assert "Traceback" not in stderr, stderr


STUCK = """
import os
import threading
from pathlib import Path

import pytest
from loom_runtime import Context, Loom

app = Loom(os.environ["SERVED_URL"], node="w1")


def stuck() -> None:
    Path("in-step").write_text("yes")
    threading.Event().wait()  # a sync step that never returns


@app.workflow(name="stuck")
async def stuck_workflow(ctx: Context) -> None:
    await ctx.step(stuck, name="stuck")
"""


async def test_a_stopping_worker_does_not_wait_for_a_sync_step_that_never_returns(
    tmp_path: Path,
) -> None:
    url = "sqlite:///" + str(tmp_path / "stuck.db")
    await left_running(url, "stuck", "s")
    worker = serve(tmp_path, url, STUCK, "--grace", "0.1")
    await until_written(worker, tmp_path / "in-step")  # the recovered run is in its step
    worker.send_signal(signal.SIGTERM)  # without the grace, it waits for ever on the thread
    stderr = finished(worker)
    assert worker.returncode == 0, stderr
    assert "leaving 1 sync step(s) still running in threads (--grace 0.1 s" in stderr


async def test_a_second_signal_cuts_the_grace_short(tmp_path: Path) -> None:
    url = "sqlite:///" + str(tmp_path / "stuck.db")
    await left_running(url, "stuck", "s")
    worker = serve(tmp_path, url, STUCK, "--grace", "3000")
    await until_written(worker, tmp_path / "in-step")  # the recovered run is in its step
    worker.send_signal(signal.SIGTERM)
    assert worker.stderr is not None
    while "a second SIGINT or SIGTERM stops at once" not in (line := worker.stderr.readline()):
        assert line, "the worker ended before it said it waits for its step"
    worker.send_signal(signal.SIGINT)  # without it, the worker waits its grace of 3000 s
    stderr = finished(worker)
    assert worker.returncode == 0, stderr
    assert "leaving 1 sync step(s) still running in threads" in stderr


ENTERING = """
import os
from pathlib import Path

from loom_runtime import Loom


class Served(Loom):
    async def __aenter__(self) -> Loom:
        Path("entering").write_text("yes")  # the worker's signal handlers are in place
        return await super().__aenter__()


app = Served(os.environ["SERVED_URL"], node="w1")
"""


async def test_a_second_signal_stops_a_worker_waiting_for_a_lock_another_process_holds(
    tmp_path: Path,
) -> None:
    """Another process holds the file's write lock (a new file, so opening it must take
    the lock to switch it to WAL), and the worker waits up to busy_timeout_ms for it:
    the first signal is heard once the wait ends, a second stops the wait."""
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        worker = serve(tmp_path, f"sqlite:///{path}?busy_timeout_ms=3600000", ENTERING)
        await until_written(worker, tmp_path / "entering")
        worker.send_signal(signal.SIGTERM)
        worker.send_signal(signal.SIGINT)  # without it, the worker waits for the lock an hour
        stderr = finished(worker)
    finally:
        holder.close()
    assert worker.returncode == 0, stderr
    assert "a second SIGINT or SIGTERM while the app was still entering or leaving" in stderr
    assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("grace", ["inf", "nan", "1e300", "-1"])
def test_the_worker_refuses_a_grace_that_is_no_number_of_seconds_it_can_wait(
    tmp_path: Path, grace: str
) -> None:
    """An endless grace would reach a thread's join as an overflow when the worker
    stops, and NaN would act as 0: each is refused before the worker starts."""
    done = subprocess.run(
        [sys.executable, "-m", "loom_runtime", "worker", "--app", "x:app", "--grace", grace],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--grace" in done.stderr
    assert "Traceback" not in done.stderr


STUBBORN = """
import asyncio
import logging
import os
from pathlib import Path

from loom_runtime import Context, Loom

app = Loom(os.environ["SERVED_URL"], node="w1")


async def stubborn() -> None:
    Path("in-step").write_text("yes")
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:  # an async step that never ends when cancelled
            Path("cancelled").write_text("yes")


@app.workflow(name="stubborn")
async def stubborn_workflow(ctx: Context) -> None:
    await ctx.step(stubborn, name="stubborn")
"""


async def test_a_second_signal_ends_a_worker_whose_step_does_not_end_when_cancelled(
    tmp_path: Path,
) -> None:
    """Leaving the app cancels the step's task until it ends, which this one never does:
    the second signal ends the process at once, the execution left running for the
    node's next start."""
    url = "sqlite:///" + str(tmp_path / "stubborn.db")
    await left_running(url, "stubborn", "s")
    worker = serve(tmp_path, url, STUBBORN)
    await until_written(worker, tmp_path / "in-step")  # the recovered run is in its step
    worker.send_signal(signal.SIGTERM)
    await until_written(worker, tmp_path / "cancelled")  # the app is leaving, the step stays
    worker.send_signal(signal.SIGTERM)  # without it, the worker leaves for ever
    stderr = finished(worker)
    assert worker.returncode == 0, stderr
    assert "a second SIGINT or SIGTERM while the app was still entering or leaving" in stderr
    checker = Loom(url, node="checker", recover=False, timers=False)
    async with checker:
        assert await checker.get("s").status() == "running"



HELD = """
import asyncio
import logging
import os
from pathlib import Path

from loom_runtime import Context, Loom

app = Loom(os.environ["SERVED_URL"], node="w1")


async def held() -> str:
    Path("in-step").write_text("yes")
    while not Path("go").exists():  # the test says when the step may end
        await asyncio.sleep(0.01)
    return "done"


@app.workflow(name="held")
async def held_workflow(ctx: Context) -> str:
    return await ctx.step(held, name="held")


@app.workflow(name="sleeper")
async def sleeper(ctx: Context) -> None:
    await ctx.sleep(3600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_worker_stopped_in_a_step_with_a_timer_pending_exits_0_and_the_next_carries_on(
    tmp_path: Path, signum: signal.Signals
) -> None:
    url = "sqlite:///" + str(tmp_path / "held.db")
    await left_running(url, "held", "h")
    parker = Loom(url, node="w1", recover=False)

    async def sleeper(ctx: Context) -> None:
        await ctx.sleep(3600)

    parker.workflow(name="sleeper")(sleeper)
    async with parker:
        await parker.start("sleeper", id="z")
        await parker.drain()
    worker = serve(tmp_path, url, HELD)
    await until_written(worker, tmp_path / "in-step")  # the recovered run is in its step
    worker.send_signal(signum)
    stderr = finished(worker)
    assert worker.returncode == 0, stderr
    assert "loom worker: stopped" in stderr
    checker = Loom(url, node="checker", recover=False, timers=False)
    async with checker:
        assert await checker.get("h").status() == "running"
        assert await checker.get("z").status() == "suspended"
        (tmp_path / "go").write_text("yes")
        worker = serve(tmp_path, url, HELD)
        try:
            assert await checker.get("h").result(timeout=60) == "done"
            assert await checker.get("z").status() == "suspended"
        finally:
            worker.send_signal(signal.SIGTERM)
            _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr


def test_a_worker_whose_app_registers_no_workflow_says_what_to_import(tmp_path: Path) -> None:
    """An app whose workflows are registered by modules the --app module does not import
    (the app in orders/app.py, the workflows in orders/flows.py) serves nothing: the worker
    says so at its start, rather than only failing each parked execution later."""
    url = "sqlite:///" + str(tmp_path / "bare.db")
    worker = serve(tmp_path, url, "import os\nfrom loom_runtime import Loom\n"
                   "app = Loom(os.environ['SERVED_URL'], node='w1')\n")
    try:
        assert worker.stderr is not None
        lines: list[str] = []
        while not lines or "SIGINT or SIGTERM stops it" not in lines[-1]:
            line = worker.stderr.readline()
            assert line, (lines, worker.communicate())
            lines.append(line)
    finally:
        worker.send_signal(signal.SIGTERM)
        stderr = finished(worker)
    assert worker.returncode == 0, stderr
    said = "".join(lines)
    assert "no workflow is registered on served_app:app" in said
    assert "@app.workflow" in said
    assert "0 workflow(s)" in said


def test_a_worker_whose_app_registers_workflows_gives_no_such_warning(tmp_path: Path) -> None:
    worker = serve(tmp_path, "sqlite:///" + str(tmp_path / "served.db"))
    try:
        assert worker.stderr is not None
        first = worker.stderr.readline()
    finally:
        worker.send_signal(signal.SIGTERM)
        stderr = finished(worker)
    assert "1 workflow(s)" in first, first + stderr
    assert "no workflow is registered" not in first + stderr


LOGGED = """
import os
from loom_runtime import Context, Loom

app = Loom(os.environ["SERVED_URL"], node="w1")


def answer() -> int:
    return 42


@app.workflow(name="logged")
async def logged(ctx: Context) -> int:
    ctx.logger.info("before the steps")
    first = await ctx.step(answer, name="first")
    second = await ctx.step(answer, name="second")
    ctx.logger.info("after the steps: %d", first + second)
    return first + second
"""


async def logged(ctx: Context) -> int:
    """LOGGED's workflow, as this process registers it."""
    ctx.logger.info("before the steps")
    first = await ctx.step(answer, name="first")
    second = await ctx.step(answer, name="second")
    ctx.logger.info("after the steps: %d", first + second)
    return first + second


async def left_logging(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """An execution of LOGGED's workflow, "logged-1", left running under w1 by a process
    that died before its second step: it said its first line, live, here."""
    left = Loom(url, node="w1", recover=False)
    left.workflow(name="logged")(logged)
    with caplog.at_level(logging.INFO, logger="loom_runtime.workflow.logged"):
        async with left:
            crash = crash_at(left, step="second", when="before")
            await left.start("logged", id="logged-1")
            await crash.fired.wait()
            await left.drain()
    said = [r.getMessage() for r in caplog.records if r.name == "loom_runtime.workflow.logged"]
    assert said == ["before the steps"]


async def until_done(url: str, execution_id: str) -> int:
    checker = Loom(url, node="checker", recover=False, timers=False)
    async with checker:
        value = await checker.get(execution_id).result(timeout=60)
    assert isinstance(value, int)
    return value


async def test_the_worker_logs_a_workflows_live_lines_once_with_level_logger_and_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker recovering an execution another process started shows, at its default
    level, what the body logs from where the recovery goes on, each line once with its
    level, its logger and the execution's id; the line the dead process logged before a
    call its log holds is replayed, not logged again."""
    url = "sqlite:///" + str(tmp_path / "logged.db")
    await left_logging(url, caplog)
    worker = serve(tmp_path, url, LOGGED)
    try:
        assert await until_done(url, "logged-1") == 84
    finally:
        worker.send_signal(signal.SIGTERM)
        stderr = finished(worker)
    assert worker.returncode == 0, stderr
    said = [line for line in stderr.splitlines() if "the steps" in line]
    assert len(said) == 1, stderr
    (line,) = said
    assert "after the steps: 84" in line
    assert "INFO" in line
    assert "loom_runtime.workflow.logged" in line
    assert "logged-1" in line


async def test_the_workers_log_level_option_hides_the_lines_below_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = "sqlite:///" + str(tmp_path / "logged.db")
    await left_logging(url, caplog)
    worker = serve(tmp_path, url, LOGGED, "--log-level", "WARNING")
    try:
        assert await until_done(url, "logged-1") == 84
    finally:
        worker.send_signal(signal.SIGTERM)
        stderr = finished(worker)
    assert worker.returncode == 0, stderr
    assert "the steps" not in stderr


def test_the_worker_refuses_a_log_level_it_does_not_know(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loom_runtime", "worker", "--app", "served_app:app",
         "--log-level", "LOUD"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 2
    assert "--log-level" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_worker_leaves_the_logging_its_app_module_configured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = "sqlite:///" + str(tmp_path / "logged.db")
    await left_logging(url, caplog)
    configured = LOGGED.replace(
        "import os\n",
        "import logging\nimport os\n\nlogging.basicConfig(format='APP %(message)s', "
        "level=logging.INFO)\n",
    )
    worker = serve(tmp_path, url, configured, "--log-level", "ERROR")
    try:
        assert await until_done(url, "logged-1") == 84
    finally:
        worker.send_signal(signal.SIGTERM)
        stderr = finished(worker)
    assert worker.returncode == 0, stderr
    assert "APP after the steps: 84" in stderr.splitlines()
