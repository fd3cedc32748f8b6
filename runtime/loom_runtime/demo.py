"""The kill demo: a workflow whose steps leave traces outside Loom, a worker process that
runs it and is SIGKILLed, a restart that finishes it from the log, and the check that the
log and the traces agree.

``python3 -m loom_runtime demo`` runs one trial on SQLite and prints its timeline; the
runtime's kill tests run many, with kills at random points, on SQLite and PostgreSQL,
through this same worker and this same check.

The workflow (:data:`WORKFLOW`) runs steps ``step-1`` … ``step-N``. Each step, before its
effect, appends ``<step> <pid> start`` to ``trace.log`` in the trial's directory; then
does a few milliseconds of real work; then bumps its counter in ``counters.json`` (one
atomic file replace) and returns ``{"step", "pid", "count"}``, which the log records. A
body that gets a step's result from the log (recorded by another process) appends
``<step> <pid> replayed``.

The worker is this module run as a script::

    python -m loom_runtime.demo URL EXECUTION_ID DIRECTORY [--steps N] [--work-ms MS]
                                [--hold-at STEP]

It opens ``Loom(URL, node="w1")`` (every restart is the same node, so entering the app
recovers what the killed one was running), starts the execution unless it exists, waits
for its result, and prints one line per fact, flushed at once: ``started <pid>`` (it
started the execution) or ``recovering <pid>`` (it existed), ``holding <step> <pid>``
(``--hold-at``: that step's effect is done and its record not yet written, and the step
waits there to be killed), ``completed <pid> <result JSON>``. It exits 1 with the error
on stderr otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import itertools
import json
import os
import signal
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, TypeAlias, cast
from urllib.parse import quote

from loom_core import (
    Event,
    EventKind,
    ExecutionAlreadyExistsError,
    InvalidOptionError,
    JsonValue,
    LoomError,
    open_storage,
)
from loom_runtime.app import Loom
from loom_runtime.context import Context
from loom_runtime.testing import ChildProcess

__all__ = [
    "NODE",
    "WORKFLOW",
    "DemoError",
    "Trace",
    "Trial",
    "TimelineRow",
    "Worker",
    "WorkerCommand",
    "build_app",
    "middle_step",
    "perform_step",
    "run_demo",
    "run_trial",
    "step_names",
    "timeline",
    "violations",
    "worker_main",
]

WORKFLOW: Final = "demo.counted-steps"
NODE: Final = "w1"
TRACE_FILE: Final = "trace.log"
COUNTERS_FILE: Final = "counters.json"
HOLD_SECONDS: Final = 120.0
"""How long a held step waits to be killed before it gives up (and fails the run)."""
LINE_TIMEOUT: Final = 60.0
"""Seconds the trial waits for a worker's next line or its exit."""

WorkerCommand: TypeAlias = Sequence[str]
"""The argv prefix that starts a worker; the trial appends the worker's arguments."""

DEFAULT_WORKER: Final[WorkerCommand] = (sys.executable, "-m", "loom_runtime.demo")


class DemoError(LoomError):
    """A worker of the demo did not do what it must (it failed, hung, or said something
    unexpected); the message carries its stderr."""


# -- the effects outside Loom --------------------------------------------------------------


def step_names(steps: int) -> list[str]:
    return [f"step-{k}" for k in range(1, steps + 1)]


def middle_step(steps: int) -> str:
    """The step the demo's first worker dies in."""
    return step_names(steps)[steps // 2]


def _trace(directory: str, step: str, what: Literal["start", "replayed"]) -> None:
    # One write(2) of a short line to an O_APPEND file: a kill leaves it whole or absent.
    line = f"{step} {os.getpid()} {what}\n".encode()
    fd = os.open(Path(directory, TRACE_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _read_counters(directory: str | Path) -> dict[str, int]:
    path = Path(directory, COUNTERS_FILE)
    if not path.exists():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return {str(k): int(v) for k, v in loaded.items()}


def _bump(directory: str, step: str) -> int:
    counters = _read_counters(directory)
    counters[step] = counters.get(step, 0) + 1
    scratch = Path(directory, COUNTERS_FILE + ".tmp")
    scratch.write_text(json.dumps(counters, sort_keys=True), encoding="utf-8")
    os.replace(scratch, Path(directory, COUNTERS_FILE))  # atomic: old file or new, never half
    return counters[step]


def perform_step(
    directory: str, step: str, work_ms: float, hold_at: str | None = None
) -> dict[str, JsonValue]:
    """The step's effect: trace the start, work ``work_ms`` milliseconds (hashing), bump
    the step's counter; with ``hold_at == step`` wait to be killed before returning."""
    _trace(directory, step, "start")
    digest = step.encode()
    deadline = time.perf_counter() + work_ms / 1000
    while time.perf_counter() < deadline:
        digest = hashlib.sha256(digest).digest()
    count = _bump(directory, step)
    if step == hold_at:
        _say(f"holding {step} {os.getpid()}")
        time.sleep(HOLD_SECONDS)
        raise DemoError(f"{step} held for {HOLD_SECONDS:.0f} s and nobody killed the worker")
    return {"step": step, "pid": os.getpid(), "count": count}


# -- the workflow and the worker process ---------------------------------------------------


def build_app(url: str, *, hold_at: str | None = None) -> Loom:
    """The demo's app on ``url`` as node :data:`NODE`, with :data:`WORKFLOW` registered."""
    app = Loom(url, node=NODE, on_error=_report)
    step = functools.partial(perform_step, hold_at=hold_at)

    @app.workflow(name=WORKFLOW)
    async def counted_steps(
        ctx: Context, directory: str, steps: int, work_ms: float
    ) -> list[JsonValue]:
        results: list[JsonValue] = []
        for name in step_names(steps):
            result = await ctx.step(step, directory, name, work_ms, name=name)
            if result["pid"] != os.getpid():
                _trace(directory, name, "replayed")
            results.append(result)
        return results

    return app


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _report(error: BaseException) -> None:
    print(f"loom error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


async def _serve_one(
    app: Loom, execution_id: str, directory: str, steps: int, work_ms: float
) -> None:
    async with app:
        try:
            handle = await app.start(WORKFLOW, directory, steps, work_ms, id=execution_id)
            _say(f"started {os.getpid()}")
        except ExecutionAlreadyExistsError:
            handle = app.get(execution_id)  # entering the app recovers it, if it runs
            _say(f"recovering {os.getpid()}")
        result = await handle.result(timeout=LINE_TIMEOUT)
        _say(f"completed {os.getpid()} {json.dumps(result, sort_keys=True)}")


def worker_main(argv: Sequence[str], build: Callable[..., Loom] = build_app) -> int:
    """The worker process: ``build(url, hold_at=...)`` an app and drive one execution."""
    parser = argparse.ArgumentParser(prog="python -m loom_runtime.demo")
    parser.add_argument("url")
    parser.add_argument("execution_id")
    parser.add_argument("directory")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--work-ms", type=float, default=3.0)
    parser.add_argument("--hold-at", default=None)
    args = parser.parse_args(argv)
    app = build(args.url, hold_at=args.hold_at)
    try:
        asyncio.run(_serve_one(app, args.execution_id, args.directory, args.steps, args.work_ms))
    except (LoomError, OSError) as exc:
        _report(exc)
        return 1
    return 0


# -- a trial: start a worker, kill it, restart it, read what they left ----------------------


@dataclass(frozen=True, slots=True)
class Worker:
    """One worker process of a trial, in start order."""

    index: int
    pid: int
    role: Literal["started", "recovering"]
    killed: bool
    result: JsonValue = None
    lines: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, index: int, process: ChildProcess, role: Literal["started", "recovering"]
    ) -> Worker:
        """What a reaped worker process said: its result is on its ``completed`` line."""
        result: JsonValue = None
        for line in process.lines:
            word, _, rest = line.partition(" ")
            if word == "completed":
                result = json.loads(rest.partition(" ")[2])
        return cls(index, process.pid, role, process.killed, result, tuple(process.lines))


@dataclass(frozen=True, slots=True)
class Trace:
    """A line of ``trace.log``: ``pid`` started ``step`` live, or got it from the log."""

    step: str
    pid: int
    what: Literal["start", "replayed"]


@dataclass(frozen=True, slots=True)
class Trial:
    """Everything a trial left: its workers, the execution's log, the traces, the
    counters."""

    execution_id: str
    steps: int
    workers: tuple[Worker, ...]
    log: tuple[Event, ...]
    traces: tuple[Trace, ...]
    counters: Mapping[str, int]
    ran_for: float
    """Seconds from the first worker's ``started`` line to its ``completed`` line (or to
    its kill, or its hold)."""


def _stderr(process: ChildProcess) -> str:
    text = process.stderr_tail()
    return f"; its stderr:\n{text}" if text else ""


def _failure(process: ChildProcess, what: str) -> DemoError:
    return DemoError(f"worker {process.pid} {what}{_stderr(process)}")


async def _line(process: ChildProcess) -> str:
    """The worker's next line; a worker that says nothing, or exits, fails the trial."""
    try:
        text = await process.line()
    except TimeoutError:
        process.kill()
        raise _failure(process, f"said nothing for {LINE_TIMEOUT:.0f} s") from None
    if text is None:
        raise _failure(process, f"exited {await process.finish()}")
    return text


async def _spawn(
    command: WorkerCommand, args: Sequence[str], stderr: Path, env: Mapping[str, str] | None
) -> ChildProcess:
    return await ChildProcess.spawn(
        *command, *args, stderr=stderr, env=env, line_timeout=LINE_TIMEOUT
    )


async def run_trial(
    url: str,
    execution_id: str,
    directory: Path,
    *,
    steps: int = 5,
    work_ms: float = 3.0,
    kill_after: float | None = None,
    hold_at: str | None = None,
    worker: WorkerCommand = DEFAULT_WORKER,
    env: Mapping[str, str] | None = None,
) -> Trial:
    """Run a worker on ``execution_id``; SIGKILL it ``kill_after`` seconds after it said
    ``started`` (or once it holds at ``hold_at``; with neither it is not killed); then start
    a second worker, which must finish the execution. Returns what they left. The workers
    run with ``env`` (default: this process's environment)."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    args = [url, execution_id, str(directory), "--steps", str(steps), "--work-ms", str(work_ms)]
    first = await _spawn(
        worker,
        [*args, *(["--hold-at", hold_at] if hold_at else [])],
        directory / "worker-1.stderr",
        env,
    )
    try:
        line = await _line(first)
        if line != f"started {first.pid}":
            raise _failure(first, f"said {line!r} instead of 'started'")
        began = time.perf_counter()
        if hold_at is not None:
            line = await _line(first)
            if line != f"holding {hold_at} {first.pid}":
                raise _failure(first, f"said {line!r} instead of holding at {hold_at}")
            first.kill()
        elif kill_after is not None:
            await asyncio.sleep(kill_after)
            first.kill()
        else:
            line = await _line(first)
            if not line.startswith(f"completed {first.pid} "):
                raise _failure(first, f"said {line!r} instead of 'completed'")
        ran_for = time.perf_counter() - began
        code = await first.finish()
    finally:
        first.kill()
    if code not in (0, -signal.SIGKILL):
        raise _failure(first, f"exited {code}")
    workers = [Worker.of(0, first, "started")]

    second = await _spawn(worker, args, directory / "worker-2.stderr", env)
    try:
        line = await _line(second)
        if line != f"recovering {second.pid}":
            raise _failure(second, f"said {line!r} instead of 'recovering'")
        code = await second.finish()
    finally:
        second.kill()
    if code != 0:
        raise _failure(second, f"exited {code}")
    workers.append(Worker.of(1, second, "recovering"))

    async with open_storage(url) as storage:
        log = await storage.events.read(execution_id)
    return Trial(
        execution_id,
        steps,
        tuple(workers),
        log,
        _read_traces(directory),
        _read_counters(directory),
        ran_for,
    )


def _read_traces(directory: Path) -> tuple[Trace, ...]:
    path = directory / TRACE_FILE
    if not path.exists():
        return ()
    traces = []
    for line in path.read_text(encoding="utf-8").splitlines():
        step, pid, what = line.split(" ")
        if what not in ("start", "replayed"):
            raise DemoError(f"{path} holds a line this demo never writes: {line!r}")
        traces.append(Trace(step, int(pid), cast(Literal["start", "replayed"], what)))
    return tuple(traces)


# -- the check -------------------------------------------------------------------------------


def _step_results(log: Sequence[Event]) -> dict[str, list[Mapping[str, JsonValue]]]:
    recorded: dict[str, list[Mapping[str, JsonValue]]] = {}
    for event in log:
        payload = event.payload
        if event.kind == EventKind.STEP_COMPLETED and isinstance(payload, dict):
            result = payload.get("result")
            if payload.get("call") == "step" and isinstance(result, dict):
                recorded.setdefault(str(payload.get("name")), []).append(result)
    return recorded


def violations(trial: Trial) -> list[str]:
    """Every way the trial broke the exactly-once promise (empty when it kept it):

    - the log's sequences are 0..n-1, gapless, no duplicate; one EXECUTION_STARTED first,
      exactly one EXECUTION_COMPLETED last, no failure; tokens never go down;
    - each step recorded exactly once, in order, by a worker of the trial;
    - no worker that ran after the one whose record is in the log started that step
      again, and the recording worker started it once;
    - each counter holds what the recorded run left in it (nothing bumped it after the
      record), which is at least 1 and at most the step's starts;
    - the result is the recorded steps' results, and it is what the last worker saw.
    """
    found: list[str] = []
    log = trial.log
    sequences = [e.sequence for e in log]
    if sequences != list(range(len(log))):
        found.append(f"sequences are {sequences}, not 0..{len(log) - 1} without gap or duplicate")
    kinds = [e.kind for e in log]
    if (
        not kinds
        or kinds[0] != EventKind.EXECUTION_STARTED
        or kinds.count(EventKind.EXECUTION_STARTED) != 1
    ):
        found.append("the log does not begin with its one EXECUTION_STARTED")
    completions = kinds.count(EventKind.EXECUTION_COMPLETED)
    if completions != 1:
        found.append(f"{completions} EXECUTION_COMPLETED events, not exactly one")
    elif kinds[-1] != EventKind.EXECUTION_COMPLETED:
        found.append("events follow the EXECUTION_COMPLETED")
    for kind in (EventKind.EXECUTION_FAILED, EventKind.STEP_FAILED, EventKind.EXECUTION_CANCELLED):
        if kind in kinds:
            found.append(f"the log holds {kind}")
    for before, after in itertools.pairwise(log):
        if after.fence < before.fence:
            found.append(
                f"event {after.sequence} was written under token {after.fence} after token "
                f"{before.fence}: a fenced-out writer appended"
            )

    order = {w.pid: w.index for w in trial.workers}
    recorded = _step_results(log)
    names = step_names(trial.steps)
    in_log = [
        str(p.get("name"))
        for e in log
        if e.kind == EventKind.STEP_COMPLETED and isinstance(p := e.payload, dict)
    ]
    if in_log != names:
        found.append(f"the steps recorded are {in_log}, not {names} in order")
    results: list[JsonValue] = []
    for step in names:
        records = recorded.get(step, [])
        if len(records) != 1:
            found.append(f"{step} is recorded {len(records)} times, not once")
        if not records:
            continue
        record = records[0]
        results.append(dict(record))
        recorder = record.get("pid")
        if not isinstance(recorder, int) or recorder not in order:
            found.append(f"{step} was recorded by pid {recorder}, no worker of this trial")
            continue
        starts = [t for t in trial.traces if t.step == step and t.what == "start"]
        own = sum(1 for t in starts if t.pid == recorder)
        if own != 1:
            found.append(
                f"{step}: worker {order[recorder] + 1} (pid {recorder}), whose "
                f"record is in the log, started it {own} times"
            )
        for start in starts:
            if start.pid not in order:
                found.append(f"{step} was started by pid {start.pid}, no worker of this trial")
            elif order[start.pid] > order[recorder]:
                found.append(
                    f"{step} was recorded by worker {order[recorder] + 1} (pid {recorder}) "
                    f"and started again by worker {order[start.pid] + 1} (pid {start.pid})"
                )
        counter = trial.counters.get(step, 0)
        if counter != record.get("count"):
            found.append(
                f"{step}'s counter is {counter}, but its recorded run left it at "
                f"{record.get('count')}"
            )
        if not 1 <= counter <= len(starts):
            found.append(f"{step}'s counter is {counter} after {len(starts)} starts")
    completed = [e for e in log if e.kind == EventKind.EXECUTION_COMPLETED]
    if completed:
        payload = completed[-1].payload
        result = payload.get("result") if isinstance(payload, dict) else None
        if result != results:
            found.append(f"the result {result} is not the recorded steps' results {results}")
        if trial.workers and trial.workers[-1].result != result:
            found.append(f"the last worker saw {trial.workers[-1].result}, the log holds {result}")
    return found


# -- the timeline ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One line of the timeline: which process did what."""

    worker: int
    pid: int
    what: str
    detail: str = ""


def timeline(trial: Trial) -> list[TimelineRow]:
    """What ran in which process, what was served from the log on replay, the kill."""
    recorder = {step: r[0].get("pid") for step, r in _step_results(trial.log).items()}
    workers = {w.pid: w for w in trial.workers}
    rows: list[TimelineRow] = []
    for worker in trial.workers:
        number, pid = worker.index + 1, worker.pid
        rows.append(
            TimelineRow(
                number,
                pid,
                "started the execution"
                if worker.role == "started"
                else "took over the execution from the log",
            )
        )
        running: str | None = None
        for trace in trial.traces:
            if trace.pid != pid:
                continue
            if trace.what == "replayed":
                by = workers.get(cast(int, recorder.get(trace.step)))
                rows.append(
                    TimelineRow(
                        number,
                        pid,
                        f"{trace.step} served from the log",
                        f"recorded by worker {by.index + 1}" if by else "",
                    )
                )
            else:
                again = any(
                    t.step == trace.step
                    and t.what == "start"
                    and t.pid != pid
                    and workers[t.pid].index < worker.index
                    for t in trial.traces
                    if t.pid in workers
                )
                what = f"{trace.step} ran" + (" again" if again else "")
                if recorder.get(trace.step) == pid:
                    rows.append(
                        TimelineRow(
                            number,
                            pid,
                            what,
                            "recorded"
                            + (" (its earlier run died before its record)" if again else ""),
                        )
                    )
                else:
                    running = trace.step
                    rows.append(TimelineRow(number, pid, what, "not recorded: the process died"))
        if worker.killed:
            done = sum(1 for p in recorder.values() if p == pid)
            where = f"while {running} ran" if running else "between two durable writes"
            rows.append(
                TimelineRow(
                    number, pid, "SIGKILL", f"{where}; {done} of {trial.steps} steps recorded"
                )
            )
        elif worker.result is not None:
            rows.append(TimelineRow(number, pid, "completed", "EXECUTION_COMPLETED in the log"))
    return rows


# -- the demo --------------------------------------------------------------------------------


SQLITE_HEADER: Final = b"SQLite format 3\x00"
_DEMO_IDS: Final = ("demo", "$inbox:demo")


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _not_the_demos(db: Path) -> str | None:
    """What the SQLite database ``db`` holds that an earlier demo did not leave (tables
    not Loom's, executions other than the demo's, or that it cannot be read), or None."""
    try:
        connection = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
        try:
            tables = sorted(
                str(name) for (name,) in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                )
            )
            others = [t for t in tables if not t.startswith(("loom_", "sqlite_"))]
            if others:
                return f"tables that are not Loom's ({', '.join(others)})"
            if "loom_events" in tables:
                ids = sorted(
                    str(execution_id) for (execution_id,) in connection.execute(
                        "SELECT DISTINCT execution_id FROM loom_events"
                    )
                )
                theirs = [i for i in ids if i not in _DEMO_IDS]
                if theirs:
                    return f"executions other than the demo's ({', '.join(theirs[:5])})"
        finally:
            connection.close()
    except sqlite3.Error as exc:
        return f"what cannot be read ({exc})"
    return None


def _start_afresh(db: Path) -> Path:
    """Delete what an earlier demo left at ``db`` (the database, its ``-wal`` and ``-shm``,
    the traces in ``<db stem>.effects``) and give that directory. Refused with
    InvalidOptionError, deleting nothing, when ``db`` is anything but a SQLite file or
    nothing (a text file, a link, a device, a directory), its directory is missing, or
    it is named as its own traces directory (``x.effects``): the demo deletes only what
    it could have made."""
    if not db.parent.is_dir():
        raise InvalidOptionError(
            f"the directory of {str(db)!r} does not exist; create it, or give the demo a "
            "file in a directory that does"
        )
    directory = db.with_suffix(".effects")
    if directory == db:
        raise InvalidOptionError(
            f"{str(db)!r} is where the demo keeps its traces, a directory named after its "
            "database with '.effects'; give the database another name (e.g. ending in .db)"
        )
    if db.exists() or db.is_symlink():
        if not _is_regular(db):
            raise InvalidOptionError(
                f"{str(db)!r} is not a regular file; the demo deletes and recreates its "
                "database, so give it a new path or the database of an earlier demo"
            )
        with db.open("rb") as file:
            head = file.read(len(SQLITE_HEADER))
        if head and head != SQLITE_HEADER:
            raise InvalidOptionError(
                f"{str(db)!r} is not a SQLite database; the demo deletes and recreates "
                "its database, so give it a new path or the database of an earlier demo"
            )
        if head and (found := _not_the_demos(db)) is not None:
            raise InvalidOptionError(
                f"{str(db)!r} holds {found}: the demo deletes and recreates its "
                "database, so give it a new path or the database of an earlier demo"
            )
    if directory.exists() and (directory.is_symlink() or not directory.is_dir()):
        raise InvalidOptionError(
            f"{str(directory)!r}, where the demo keeps its traces, is not a directory; "
            "move it away or give the demo another path"
        )
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if _is_regular(stale):
            stale.unlink()
    if directory.is_dir():
        for child in directory.iterdir():
            if _is_regular(child) and (
                child.name in (TRACE_FILE, COUNTERS_FILE, COUNTERS_FILE + ".tmp")
                or (child.name.startswith("worker-") and child.name.endswith(".stderr"))
            ):
                child.unlink()
    return directory


def run_demo(db: Path, *, steps: int = 5, work_ms: float = 20.0) -> tuple[Trial, Path]:
    """Delete what an earlier demo left at ``db``, then run one trial on it whose first
    worker is killed in the middle step, after its effect and before its record. Returns
    the trial and the directory of its traces (``<db stem>.effects`` beside it). Refused
    with InvalidOptionError when ``db`` holds anything but a SQLite database."""
    db = Path(os.path.abspath(db))
    directory = _start_afresh(db)
    trial = asyncio.run(
        run_trial(
            "sqlite:///" + quote(str(db)),  # a file name is not URL text: "%41", "?"
            "demo",
            directory,
            steps=steps,
            work_ms=work_ms,
            hold_at=middle_step(steps),
        )
    )
    return trial, directory


if __name__ == "__main__":
    raise SystemExit(worker_main(sys.argv[1:]))
