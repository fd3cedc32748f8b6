"""The app the PostgreSQL outage tests serve with ``loom worker --app outage_app:app``.

An operator's app module, configured from the environment: ``LOOM_OUTAGE_URL`` (the
storage), ``LOOM_OUTAGE_DIR`` (where the steps leave their traces and the hooks their
reports), and the store's option: ``LOOM_OUTAGE_RECONNECT`` (PostgreSQL's
``reconnect_timeout``, seconds) or ``LOOM_OUTAGE_BUSY_MS`` (SQLite's ``busy_timeout_ms``).
The SQLite tests of several processes on one file serve it too.

The workflow (:data:`WORKFLOW`) parks on a short sleep first, so that a client that
starts it (and registers it, with its timers off) hands it to the worker's timer service;
then runs step ``a``, sleeps ``pause`` seconds, waits for a message on :data:`TOPIC`,
runs step ``b`` and returns what it got. Each step appends
``start <execution> <step> <pid> <token>`` to :data:`TRACE_FILE` (one ``write(2)`` to an
``O_APPEND`` file), then waits until the file ``gate-<execution>-<step>`` exists (the test
holds a step mid-flight by not creating it), and returns its token, which the log records:
the trace says how often each step's effect ran, outside Loom.

``on_error`` and ``on_storage_error`` append one line each to :data:`REPORTS_FILE`:
``<hook> <execution or -> <error type> <LoomError or not> <message>``.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from pathlib import Path
from typing import Final

from loom_runtime import Context, Loom

from loom_core import JsonValue, LoomError

WORKFLOW: Final = "outage.flow"
TOPIC: Final = "go"
TRACE_FILE: Final = "trace.log"
REPORTS_FILE: Final = "reports.log"
HANDOVER: Final = 0.05
"""Seconds of the first sleep, at which a starting client parks the execution."""
GATE_SECONDS: Final = 600.0
"""How long a step waits for its gate before it fails (a test that forgot it)."""
NODE: Final = "outage-worker"


def append_line(directory: str, name: str, line: str) -> None:
    # One write(2) of a line to an O_APPEND file: whole or absent, whoever writes beside it.
    fd = os.open(Path(directory, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
    finally:
        os.close(fd)


def gate(directory: str, execution_id: str, step: str) -> Path:
    return Path(directory, f"gate-{execution_id}-{step}")


def effect(directory: str, execution_id: str, step: str) -> dict[str, JsonValue]:
    """The step's effect: trace it, wait for its gate, return a token of this run."""
    token = uuid.uuid4().hex
    append_line(directory, TRACE_FILE, f"start {execution_id} {step} {os.getpid()} {token}")
    deadline = time.monotonic() + GATE_SECONDS
    while not gate(directory, execution_id, step).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{execution_id} {step}: nobody opened its gate")
        time.sleep(0.01)
    return {"step": step, "pid": os.getpid(), "token": token}


def _report(directory: str, hook: str, execution_id: str, error: BaseException) -> None:
    append_line(
        directory,
        REPORTS_FILE,
        f"{hook} {execution_id} {type(error).__name__} {isinstance(error, LoomError)} {error}",
    )


def build(
    url: str,
    directory: str,
    *,
    reconnect_timeout: float | None = None,
    busy_timeout_ms: int | None = None,
    node: str = NODE,
    timers: bool = True,
    recover: bool = True,
) -> Loom:
    """The outage app on ``url``, its traces and reports in ``directory``."""
    options: dict[str, object] = {}
    if reconnect_timeout is not None:
        options["reconnect_timeout"] = reconnect_timeout
    if busy_timeout_ms is not None:
        options["busy_timeout_ms"] = busy_timeout_ms
    app = Loom(
        url,
        node=node,
        options=options,
        on_error=lambda error: _report(directory, "on_error", "-", error),
        on_storage_error=functools.partial(_report, directory, "on_storage_error"),
        poll_interval=0.05,
        timers=timers,
        recover=recover,
    )

    @app.workflow(name=WORKFLOW)
    async def flow(ctx: Context, directory: str, pause: float) -> dict[str, JsonValue]:
        execution_id = ctx.execution_id
        await ctx.sleep(HANDOVER)
        a = await ctx.step(effect, directory, execution_id, "a", name="a")
        await ctx.sleep(pause)
        note = await ctx.receive(TOPIC)
        b = await ctx.step(effect, directory, execution_id, "b", name="b")
        return {"a": a, "note": note, "b": b}

    return app


@functools.cache
def _from_environment() -> Loom:
    reconnect = os.environ.get("LOOM_OUTAGE_RECONNECT")
    busy = os.environ.get("LOOM_OUTAGE_BUSY_MS")
    return build(
        os.environ["LOOM_OUTAGE_URL"],
        os.environ["LOOM_OUTAGE_DIR"],
        reconnect_timeout=None if reconnect is None else float(reconnect),
        busy_timeout_ms=None if busy is None else int(busy),
    )


def __getattr__(name: str) -> Loom:
    # `loom worker --app outage_app:app` builds the app from the environment; importing
    # the module for build() needs none.
    if name == "app":
        return _from_environment()
    raise AttributeError(name)
