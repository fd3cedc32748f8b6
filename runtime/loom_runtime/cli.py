"""The ``loom`` command (also ``python -m loom_runtime``).

- ``loom demo [--db PATH] [--steps N]``: run a workflow on SQLite in a worker process,
  SIGKILL it in the middle, finish it in a second process from the log, print the
  timeline and the log, and check that every step ran to its record exactly once
  (exit 1 with the violations when not).
- ``loom worker --app module:attribute [--grace SECONDS] [--log-level LEVEL]``: serve a
  :class:`~loom_runtime.Loom` app (its timers, and recovery of the executions its node was
  running) until SIGINT or SIGTERM; sync steps still running in threads then get
  ``--grace`` seconds before the process exits without them. A second SIGINT or SIGTERM
  ends that wait, or ends the process at once while the app is still entering or leaving
  (a store call waiting for a lock another process holds, a step that does not end when
  cancelled). It writes log lines at ``--log-level`` (INFO by default) and above to
  stderr, unless the app's module configured logging itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from loom_core import EventKind, LoomError
from loom_runtime.app import Loom
from loom_runtime.demo import Trial, middle_step, run_demo, step_names, timeline, violations

__all__ = ["main"]

_MOST_GRACE = 86_400.0
"""The longest --grace a worker takes (a day): a thread's join refuses an endless one."""

_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _finite(context: click.Context, parameter: click.Parameter, value: float) -> float:
    if value != value:  # NaN passes a range's comparisons
        raise click.BadParameter("must be a number of seconds, not nan")
    return value


T = TypeVar("T")


@click.group()
def main() -> None:
    """Loom: durable workflows on an append-only, fenced event log."""


@main.command()
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("loom-demo.db"),
    show_default=True,
    help=(
        "The SQLite file to run on; an earlier demo's database there is deleted first, "
        "anything else there is refused."
    ),
)
@click.option(
    "--steps",
    type=click.IntRange(min=1, max=50),
    default=5,
    show_default=True,
    help="How many steps the workflow runs; the first worker dies in the middle one.",
)
def demo(db: Path, steps: int) -> None:
    """Kill a worker mid-workflow and finish the workflow in another from the log."""
    click.echo(
        f"worker 1 runs a {steps}-step workflow on {db} and is SIGKILLed in "
        f"{middle_step(steps)}, after its effect and before its record; worker 2, the same "
        "node, finishes it from the log\n"
    )
    try:
        trial, directory = run_demo(db, steps=steps)
    except (LoomError, OSError) as exc:
        raise click.ClickException(f"the demo could not run: {exc}") from exc
    _print_trial(trial, db, directory)
    found = violations(trial)
    if not trial.workers[0].killed:
        found.append("the first worker was not killed mid-workflow")
    if found:
        raise click.ClickException(
            "the trial broke the exactly-once promise:\n" + "\n".join(f"- {v}" for v in found)
        )
    twice = [step for step in step_names(steps) if trial.counters.get(step, 0) > 1]
    if twice:
        click.echo(
            f"{', '.join(twice)} ran twice: a step's effect is at-least-once until its record "
            "is durable; from then on the log serves it"
        )
    click.echo(
        f"ok: {steps} step{'' if steps == 1 else 's'}, each recorded once; "
        "no recorded step ran again; "
        f"the log is 0..{len(trial.log) - 1} without a gap"
    )


def _print_trial(trial: Trial, db: Path, directory: Path) -> None:
    # Imported here: `loom worker` never prints a table and should not pay for rich.
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows = Table(title=f"timeline of execution {trial.execution_id!r} on {db}")
    for column in ("worker", "pid", "what", "detail"):
        rows.add_column(column)
    for row in timeline(trial):
        style = "bold red" if row.what == "SIGKILL" else None
        rows.add_row(str(row.worker), str(row.pid), row.what, row.detail, style=style)
    console.print(rows)

    log = Table(title="its log")
    for column in ("seq", "token", "kind", "detail"):
        log.add_column(column, justify="right" if column in ("seq", "token") else "left")
    for event in trial.log:
        detail = ""
        payload = event.payload
        if isinstance(payload, dict):
            if event.kind == EventKind.STEP_COMPLETED and isinstance(
                result := payload["result"], dict
            ):
                detail = f"{payload['name']}: pid {result['pid']}, counter {result['count']}"
            elif event.kind == EventKind.EXECUTION_RECOVERED:
                detail = f"node {payload['node']}, token {payload['fence']}"
        log.add_row(str(event.sequence), str(event.fence), event.kind, detail)
    console.print(log)
    counters = ", ".join(
        f"{step}={trial.counters.get(step, 0)}" for step in step_names(trial.steps)
    )
    console.print(f"counters outside Loom ({directory}): {counters}")


@main.command()
@click.option(
    "--app",
    "spec",
    required=True,
    metavar="MODULE:ATTRIBUTE",
    help="Where the Loom app is, e.g. orders.workflows:app.",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0, max=_MOST_GRACE),
    callback=_finite,
    default=2.0,
    show_default=True,
    help=(
        "Seconds a stopping worker waits for sync steps still running in threads (their "
        "results are not recorded any more) before it exits without them."
    ),
)
@click.option(
    "--node",
    metavar="NAME",
    default=None,
    help=(
        "Serve as this node rather than the one the app was built with (its Loom(node=...), "
        "by default the host name). Give each worker process on a host its own stable "
        "name, e.g. worker-1, worker-2: a restart recovers exactly what its name was "
        "running."
    ),
)
@click.option(
    "--log-level",
    type=click.Choice(_LEVELS, case_sensitive=False),
    envvar="LOOM_LOG_LEVEL",
    default="INFO",
    show_default=True,
    help=(
        "The least level of the lines the worker writes to stderr (LOOM_LOG_LEVEL in the "
        "environment sets it too); ignored when the app's module configured logging "
        "itself."
    ),
)
def worker(spec: str, grace: float, node: str | None, log_level: str) -> None:
    """Serve an app until SIGINT or SIGTERM: fire its due timers and recover the
    executions its node was running."""
    app = _load_app(spec)
    _log_to_stderr(log_level.upper())
    if node is not None:
        try:
            app._rename_node(node, "--node")
        except LoomError as exc:
            raise click.BadParameter(str(exc), param_hint="--node") from exc
    if not app.timers_on:
        raise click.BadParameter(
            f"{spec} is built with timers=False (an app that only starts and sends), so a "
            "worker serving it would fire nothing: build the worker's app with timers on "
            "(the default)",
            param_hint="--app",
        )
    if not app.workflows:
        # Said rather than refused: workflows may still be registered once the app runs
        # (by code of the user's), which cannot be seen from here. Most often, though, the
        # modules that register them are simply not imported by the one --app names.
        click.echo(
            f"loom worker: no workflow is registered on {spec}, so it can resume or recover "
            "no execution: import the modules whose @app.workflow functions it should run "
            "from the module --app names",
            err=True,
        )
    threads = _StepThreads()
    try:
        asyncio.run(_serve(app, threads))
    except (LoomError, OSError) as exc:
        # A storage that does not open (an unknown scheme, a directory that is not
        # there): what is wrong, not a traceback.
        raise click.ClickException(f"the worker could not serve {spec}: {exc}") from exc
    _leave_steps(app, threads, grace)
    click.echo("loom worker: stopped", err=True)


class _LineFormatter(logging.Formatter):
    """Time, level, logger, the execution a line is about when it names one (the
    ``execution_id`` that ``ctx.logger`` adds), then the message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(about)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's)
        execution_id = getattr(record, "execution_id", None)
        record.about = "" if execution_id is None else f" [{execution_id}]"
        return super().formatMessage(record)


def _log_to_stderr(level: str) -> None:
    """Write the process's log lines at ``level`` and above to stderr, one a line, unless
    the app's module configured logging itself (a handler on the root logger): its own
    configuration is left as it is. Only the command does this; the library never
    configures logging."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LineFormatter())
    root.addHandler(handler)
    root.setLevel(level)


def _load_app(spec: str) -> Loom:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(
            f"{spec!r} is not MODULE:ATTRIBUTE (e.g. orders.workflows:app)", param_hint="--app"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app is usually local
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        dotted = module_name.removesuffix(".py").replace(os.sep, ".").replace("/", ".")
        raise click.BadParameter(
            f"{module_name!r} is a file path: give the module's dotted name, as `python -m` "
            f"takes it (e.g. {dotted.strip('.')}:{attribute}), from the directory above it",
            param_hint="--app",
        )
    if module_name.startswith("."):
        raise click.BadParameter(
            f"{module_name!r} is a relative module name: give the module's full name "
            "(e.g. orders.workflows:app)",
            param_hint="--app",
        )
    try:
        module = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--app"
        ) from exc
    except LoomError as exc:
        # The module built its app wrongly (a bad option, a workflow registered twice):
        # Loom's own message says what to change, as it does when the storage does not
        # open; anything else the module raises keeps its traceback, which points into it.
        raise click.ClickException(f"the worker could not load {spec}: {exc}") from exc
    found: object = module
    where = module_name
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise click.BadParameter(
                f"{where!r} has no attribute {part!r}", param_hint="--app"
            )
        found = getattr(found, part)
        where = f"{where}.{part}"
    if not isinstance(found, Loom):
        raise click.BadParameter(
            f"{spec} is of type {type(found).__name__}, not a loom_runtime.Loom",
            param_hint="--app",
        )
    return found


async def _serve(app: Loom, threads: _StepThreads) -> None:
    """Serve ``app`` until the first SIGINT or SIGTERM, then leave it.

    Entering and leaving can wait: on the store (on SQLite a store call waits up to
    ``busy_timeout_ms`` for a write lock another process holds, and leaving lets the calls
    already queued finish), or on a run whose step does not end when cancelled. A second
    signal meanwhile ends the process at once, as a kill would: the node's next start
    carries on what it ran, from the log."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_default_executor(threads)

    def signalled() -> None:
        if stop.is_set():
            _exit_at_once(app)
        stop.set()

    for signum in _STOPPING:
        loop.add_signal_handler(signum, signalled)
    async with app:
        recovery = "" if app.recovers_on_entry else " (recover=False: it recovers nothing)"
        click.echo(
            f"loom worker: node {app.node!r}, {len(app.workflows)} workflow(s){recovery}; "
            "SIGINT or SIGTERM stops it",
            err=True,
        )
        await stop.wait()
    # A later signal is for the wait on sync steps: held from now until its handler is in
    # place (between the loop's handlers and that one, SIGTERM would kill).
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)


def _exit_at_once(app: Loom) -> None:
    """A second SIGINT or SIGTERM while the app is still entering or leaving: the process
    ends now, as a killed one would, and the node's next start carries on its executions
    from the log (nothing is half-written: each write is one atomic append)."""
    click.echo(
        "loom worker: a second SIGINT or SIGTERM while the app was still entering or "
        "leaving (a store call waiting for a lock another process holds, or a step that "
        "does not end when cancelled); exiting at once: what it ran is carried on at the "
        f"next start of node {app.node!r}",
        err=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_STOPPING: Final = {signal.SIGINT, signal.SIGTERM}


class _CutShort(Exception):
    """A second SIGINT or SIGTERM while the worker waits for its sync steps."""


def _cut_short(signum: int, frame: object) -> None:
    raise _CutShort


def _leave_steps(app: Loom, threads: _StepThreads, grace: float) -> None:
    """The app has left: a sync step still running in a thread has its result recorded
    no more, and the node's next start runs it again. Its thread is a daemon, so the
    process need not wait for it; it gets ``grace`` seconds to return first, which a
    second SIGINT or SIGTERM (held since the first, see _serve) cuts short."""
    for signum in _STOPPING:
        signal.signal(signum, _cut_short)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPPING)  # one held raises here
        running = threads.join(0)
        if running:
            click.echo(
                f"loom worker: waiting up to {grace:g} s (--grace) for sync steps still "
                "running in threads; a second SIGINT or SIGTERM stops at once",
                err=True,
            )
            running = threads.join(grace)
    except _CutShort:
        running = threads.join(0)
    finally:
        for signum in _STOPPING:
            signal.signal(signum, signal.SIG_IGN)  # a third: the worker is leaving anyway
    if running:
        click.echo(
            f"loom worker: leaving {running} sync step(s) still running in threads "
            f"(--grace {grace:g} s, or a second signal); their executions are carried on "
            f"at the next start of node {app.node!r}",
            err=True,
        )


class _StepThreads(concurrent.futures.ThreadPoolExecutor):
    """The worker's default executor (what ``asyncio.to_thread`` runs a sync step on): a
    daemon thread per call, so that a step that never returns cannot keep a stopped
    worker's process alive, as a ``ThreadPoolExecutor``'s own threads do (Python joins
    them on the way out). A ``ThreadPoolExecutor`` by type only, as asyncio requires of
    a default executor: none of its pool is used."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self._running: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    self._running.discard(threading.current_thread())

        thread = threading.Thread(target=run, name="loom-step", daemon=True)
        with self._lock:
            self._running.add(thread)
        thread.start()
        return future

    def join(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the calls running; how many still are."""
        deadline = time.monotonic() + timeout
        with self._lock:
            running = list(self._running)
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return len(self._running)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to wait for: what still runs is a daemon, abandoned (see join)."""
