"""A deliberately broken demo worker, for the kill tests' negative control.

Its body does each step's effect itself and only then records the result through a step,
so a replay does every recorded step's effect again. Run as
``python broken_worker.py URL ID DIRECTORY [--hold-at STEP] ...`` (the demo worker's
arguments)."""

from __future__ import annotations

import sys

from loom_runtime import Context, Loom
from loom_runtime.demo import NODE, WORKFLOW, perform_step, step_names, worker_main

from loom_core import JsonValue

COMMAND = (sys.executable, __file__)
"""How :func:`loom_runtime.demo.run_trial` starts this worker (its ``worker=``)."""


def build_broken(url: str, *, hold_at: str | None = None) -> Loom:
    app = Loom(url, node=NODE)

    def echo(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        return value

    @app.workflow(name=WORKFLOW)
    async def effects_outside_steps(
        ctx: Context, directory: str, steps: int, work_ms: float
    ) -> list[JsonValue]:
        results: list[JsonValue] = []
        for name in step_names(steps):
            done = perform_step(directory, name, work_ms, hold_at)  # not a step: replays too
            results.append(await ctx.step(echo, done, name=name))
        return results

    return app


if __name__ == "__main__":
    raise SystemExit(worker_main(sys.argv[1:], build=build_broken))
