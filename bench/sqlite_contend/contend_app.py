"""The app the SQLite contention run serves with ``loom worker --app contend_app:app``.

Configured from the environment: ``LOOM_CONTEND_URL`` (the storage) and
``LOOM_CONTEND_DIR`` (where steps leave their effects and the hooks their reports).

The workflow sleeps briefly (so a starter that registers it hands it to a worker's timer
service), runs step ``a``, sleeps ``pause`` seconds, receives a message on ``go``, runs
step ``b`` and returns. Each step appends ``<execution> <step> <pid> <token>`` to
``effects.log`` (one ``write(2)`` to an ``O_APPEND`` file, outside Loom) and returns the
token, which the log records. ``on_error`` and ``on_storage_error`` append one line each
to ``reports.log``: ``<hook> <execution or -> <error type> <LoomError or not> <message>``.
"""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path
from typing import Final

from loom_runtime import Context, Loom

from loom_core import JsonValue, LoomError

WORKFLOW: Final = "contend.flow"
TOPIC: Final = "go"
EFFECTS: Final = "effects.log"
REPORTS: Final = "reports.log"


def append_line(directory: str, name: str, line: str) -> None:
    fd = os.open(Path(directory, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
    finally:
        os.close(fd)


def effect(directory: str, execution_id: str, step: str) -> str:
    token = uuid.uuid4().hex
    append_line(directory, EFFECTS, f"{execution_id} {step} {os.getpid()} {token}")
    return token


def _report(directory: str, hook: str, execution_id: str, error: BaseException) -> None:
    append_line(
        directory,
        REPORTS,
        f"{hook} {execution_id} {type(error).__name__} {isinstance(error, LoomError)} {error}",
    )


def build(url: str, directory: str, *, node: str, timers: bool = True, recover: bool = True,
          busy_timeout_ms: int | None = None) -> Loom:
    options: dict[str, object] = {}
    if busy_timeout_ms is not None:
        options["busy_timeout_ms"] = busy_timeout_ms
    app = Loom(
        url,
        node=node,
        options=options or None,
        on_error=lambda error: _report(directory, "on_error", "-", error),
        on_storage_error=functools.partial(_report, directory, "on_storage_error"),
        poll_interval=0.05,
        timers=timers,
        recover=recover,
    )

    @app.workflow(name=WORKFLOW)
    async def flow(ctx: Context, directory: str, pause: float) -> dict[str, JsonValue]:
        execution_id = ctx.execution_id
        await ctx.sleep(0.02)
        a = await ctx.step(effect, directory, execution_id, "a", name="a")
        await ctx.sleep(pause)
        note = await ctx.receive(TOPIC)
        b = await ctx.step(effect, directory, execution_id, "b", name="b")
        return {"a": a, "note": note, "b": b}

    return app


@functools.cache
def _from_environment() -> Loom:
    return build(
        os.environ["LOOM_CONTEND_URL"],
        os.environ["LOOM_CONTEND_DIR"],
        node="contend-default",
        busy_timeout_ms=int(os.environ.get("LOOM_CONTEND_BUSY_MS", "5000")),
    )


def __getattr__(name: str) -> Loom:
    if name == "app":
        return _from_environment()
    raise AttributeError(name)
