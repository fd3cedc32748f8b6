"""Kill the demo's worker at random points, trial after trial, and check every trial.

Shared by the SQLite and the PostgreSQL kill tests. A trial is one execution: a worker
starts it and is SIGKILLed a random delay after it says ``started``; a second worker of
the same node finishes it from the log (see :func:`loom_runtime.demo.run_trial`). The
delays are drawn from ``random.Random(seed)`` over the window one whole run takes (the
shortest of three trials run without a kill, which are checked too). Trials go on, two at
a time, each on its own storage, until ``deaths`` workers have died of the kill; a kill
that lands after its worker exited is not counted. The checks hold wherever a kill
lands, so no outcome depends on timing.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from loom_runtime.demo import Trial, run_trial, violations

from loom_core import EventKind

LANES = 2
CALIBRATION_RUNS = 3
SEED_ENV = "LOOM_KILL_SEED"


def seed_from_environment() -> int:
    """``LOOM_KILL_SEED`` when set (to replay a reported run's draws), else a fresh one."""
    given = os.environ.get(SEED_ENV)
    return int(given) if given else random.SystemRandom().randrange(2**32)


@dataclass(slots=True)
class Summary:
    """What the kills hit, for the test's report line (never asserted: timing)."""

    seed: int
    window: float = 0.0
    trials: int = 0
    deaths: int = 0
    landed: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0

    def line(self, backend: str) -> str:
        spread = ", ".join(f"{where}: {n}" for where, n in sorted(self.landed.items()))
        return (
            f"\n{backend}: seed {self.seed} (set {SEED_ENV} to reuse it); {self.deaths} "
            f"SIGKILLs in {self.trials} trials over a {self.window * 1000:.0f} ms window, "
            f"{self.elapsed:.1f} s. Where they landed (steps the killed worker had recorded; "
            f"+step: inside the next one; done: after its completion was written): {spread}"
        )


def recorded_by_first(trial: Trial) -> int:
    """How many steps the trial's first (killed) worker recorded."""
    killed = trial.workers[0].pid
    return sum(
        1
        for e in trial.log
        if e.kind == EventKind.STEP_COMPLETED
        and isinstance(e.payload, dict)
        and isinstance(result := e.payload.get("result"), dict)
        and result.get("pid") == killed
    )


def where_it_landed(trial: Trial) -> str:
    """How far the killed worker got: steps it recorded, and whether a step was running."""
    killed = trial.workers[0].pid
    recorded = recorded_by_first(trial)
    if EventKind.EXECUTION_RECOVERED not in [e.kind for e in trial.log]:
        return "done"
    steps = {t.step for t in trial.traces if t.pid == killed and t.what == "start"}
    return f"{recorded}{'+step' if len(steps) > recorded else ''}"


async def kill_at_random(
    url_for: Callable[[int], Awaitable[str]],
    root: Path,
    *,
    deaths: int,
    seed: int,
    steps: int = 5,
    work_ms: float = 3.0,
) -> Summary:
    """Run trials until ``deaths`` workers died of their kill, trial ``i`` on the storage
    ``await url_for(i)``; raise AssertionError with every violation of every trial (and
    the seed) if any trial broke the promise."""
    rng = random.Random(seed)
    # Hundreds of worker start-ups: let them share compiled bytecode, kept out of the tree.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    summary = Summary(seed)
    began = time.perf_counter()
    failures: dict[str, list[str]] = {}

    async def trial(index: int, kill_after: float | None) -> Trial:
        url = await url_for(index)
        done = await run_trial(
            url,
            f"kill-{index}",
            root / f"trial-{index}",
            steps=steps,
            work_ms=work_ms,
            kill_after=kill_after,
            env=env,
        )
        found = violations(done)
        if found:
            failures[f"kill-{index} (kill after {kill_after}s)"] = found
        return done

    calibration = [await trial(-1 - n, None) for n in range(CALIBRATION_RUNS)]
    # The shortest: a run slowed by a busy machine must not stretch the window past the
    # runs that follow (a kill after the worker exited kills nothing).
    summary.window = min(t.ran_for for t in calibration)
    cap = deaths * 3
    in_flight = 0

    async def lane() -> None:
        nonlocal in_flight
        while summary.deaths + in_flight < deaths and summary.trials < cap:
            index = summary.trials
            summary.trials += 1
            delay = rng.uniform(0, summary.window)
            in_flight += 1
            try:
                done = await trial(index, delay)
            finally:
                in_flight -= 1
            if done.workers[0].killed:
                summary.deaths += 1
                summary.landed[where_it_landed(done)] += 1

    await asyncio.gather(*(lane() for _ in range(LANES)))
    summary.elapsed = time.perf_counter() - began
    assert not failures, f"seed {seed}: trials broke exactly-once: {failures}"
    assert summary.deaths == deaths, (
        f"seed {seed}: only {summary.deaths} of {summary.trials} kills landed before "
        "the worker exited"
    )
    return summary
