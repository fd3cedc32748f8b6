"""Kill worker and sender processes around a durable timer and a message, at random points.

The kill tests of the demo (``random_kills``) run a workflow of steps only. Here the
workflow sleeps on a durable timer and waits for a message between its steps, and a second
kind of process sends that message: a sender that does not register the workflow, as a
web front end beside the workers would (its send stores the message and leaves the
delivery to a worker's timer service, or delivers it itself when it can).

A trial, on a storage of its own: worker 1 starts the execution; a random delay after it
says ``started`` a sender is started, and worker 1 is SIGKILLed another random delay after
its ``started``, or, in half the trials, after the sender says ``sent`` (the message stored:
then the kill lands around its delivery). In some trials the sender is SIGKILLed too, a
random delay after it said ``ready`` (its app open, its send about to begin), within about
one and a half sends. If it died before it stored the message, a second sender sends the
same message again under the same key, as a client that never heard back would; if it died
after, nobody sends it again, and the wake row it wrote before storing must deliver it.

In a quarter of the trials the sender is held instead: it pauses between its wake row and
its message (the workers' timer services fire the row meanwhile and find nothing to
answer), stops once the message is stored, and is SIGKILLed there. Worker 1 is left alive
in those trials, so no restarted node puts a row back: only the row the sender wrote first
can deliver the message.

Worker 2 (the same node, so entering its app recovers what worker 1 ran) must then finish
the execution. The checks hold wherever the kills land:

- everything :func:`loom_runtime.demo.violations` checks of the log and the steps' traces
  (gapless, one ending, each recorded step run once by its recorder and never again after);
- the inbox holds the message once (the second sender's send found it under its key);
- the log consumed it exactly once, with the value sent;
- the sleep was answered no earlier than its wake time.

Run as a script, this module is the worker (``worker URL ID DIRECTORY``) or the sender
(``send URL ID [--hold]``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Final, Literal, TypeAlias, get_args

from loom_runtime import Context, Loom
from loom_runtime.demo import Trace, Trial, Worker, perform_step, violations
from loom_runtime.testing import ChildProcess
from random_kills import recorded_by_first
from store_probes import ProbedEventStore

from loom_core import Event, EventKind, JsonValue, Storage, open_storage

WORKFLOW: Final = "kills.sleep-then-receive"
NODE: Final = "w1"
TOPIC: Final = "note"
KEY: Final = "note-1"
VALUE: Final[JsonValue] = {"note": "hello"}
SLEEP: Final = 0.05
"""Seconds the workflow sleeps between its steps."""
LINE_TIMEOUT: Final = 60.0
COMMAND: Final = (sys.executable, __file__)
EARLY: Final = 3 * SLEEP
"""Seconds after ``started`` that a kill not drawn from the message lands within."""
HOLD_PAUSE: Final = 0.05
"""Seconds a held sender pauses between its wake row and its message: five polls of the
workers' timer services."""
HELD_SENDERS: Final = 0.25
"""The share of trials whose sender is held once it stored the message, and killed there."""
LANES: Final = 2
SenderDeath: TypeAlias = Literal[
    "before storing", "after storing", "held after storing", "after sent"
]
"""Where a sender's kill landed: before it stored the message (it is sent again), after
(nobody sends it again), right after, where a held sender stops (nobody sends it again),
or after it said ``sent``."""
SEND_KILL_SPANS: Final = 1.5
"""A sender's kill lands within this many sends after its ``ready``."""
CALIBRATION_RUNS: Final = 3


# -- the processes ---------------------------------------------------------------------------


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _report(error: BaseException) -> None:
    print(f"loom error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


def build_worker(url: str) -> Loom:
    """The worker's app: node :data:`NODE`, polling its timers every 10 ms."""
    app = Loom(url, node=NODE, on_error=_report, poll_interval=0.01)

    @app.workflow(name=WORKFLOW)
    async def sleep_then_receive(ctx: Context, directory: str) -> list[JsonValue]:
        first = await ctx.step(perform_step, directory, "step-1", 1.0, name="step-1")
        await ctx.sleep(SLEEP)
        await ctx.receive(TOPIC)
        second = await ctx.step(perform_step, directory, "step-2", 1.0, name="step-2")
        return [first, second]

    return app


async def _work(url: str, execution_id: str, directory: str) -> None:
    app = build_worker(url)
    async with app:
        try:
            handle = await app.start(WORKFLOW, directory, id=execution_id)
            _say(f"started {os.getpid()}")
        except Exception:
            handle = app.get(execution_id)  # it exists: entering the app recovered it
            _say(f"recovering {os.getpid()}")
        result = await handle.result(timeout=LINE_TIMEOUT)
        _say(f"completed {os.getpid()} {json.dumps(result, sort_keys=True)}")


async def _send(url: str, execution_id: str, *, hold: bool) -> None:
    # No workflow registered, no timers, no recovery: a process that only sends. Held, it
    # pauses between its wake row and its message (the workers' timer services fire the
    # row meanwhile and find nothing), then stops once the message is stored and says so,
    # for the trial to kill it there.
    base = await open_storage(url)
    probe = ProbedEventStore(base.events)
    storage = Storage(probe, base.timers, base.leases, url=base.url, on_close=base.close)
    inbox = f"$inbox:{execution_id}"

    async def pause(stream: str, kinds: tuple[str, ...]) -> None:
        if stream == inbox:
            await asyncio.sleep(HOLD_PAUSE)

    async def stop(stream: str, kinds: tuple[str, ...]) -> None:
        if stream == inbox:
            _say(f"holding {os.getpid()}")
            await asyncio.Event().wait()

    if hold:
        probe.before_append, probe.after_append = pause, stop
    try:
        async with Loom(
            storage, node="sender", on_error=_report, timers=False, recover=False
        ) as app:
            _say(f"ready {os.getpid()}")
            began = time.perf_counter()
            sent = await app.send(execution_id, TOPIC, VALUE, key=KEY)
            _say(f"sent {os.getpid()} {sent} {time.perf_counter() - began:.6f}")
    finally:
        await storage.close()


def main(argv: list[str]) -> int:
    role, url, execution_id, *rest = argv
    if role == "worker":
        asyncio.run(_work(url, execution_id, rest[0]))
    else:
        asyncio.run(_send(url, execution_id, hold=rest == ["--hold"]))
    return 0


# -- a trial ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Kills:
    """When a trial's kills land, in seconds: the sender's start and worker 1's kill (None:
    no kill) after worker 1 said ``started``, or worker 1's after a sender said ``sent``
    (``from_sent``); the sender's kill after it said ``ready``, or (``hold_sender``) once it
    stored the message and holds there."""

    send_after: float
    worker_after: float | None
    sender_after: float | None
    from_sent: bool = False
    hold_sender: bool = False


@dataclass(frozen=True, slots=True)
class WaitsTrial:
    trial: Trial
    messages: int
    """Messages in the receiver's inbox."""
    consumed: tuple[JsonValue, ...]
    """The values of the log's MESSAGE_CONSUMED events."""
    sleep: tuple[datetime, datetime] | None
    """The sleep's wake time and when its answer was recorded."""
    senders: int
    sender_death: SenderDeath | None
    """Where the first sender's kill landed (None: it was not killed)."""
    send_span: float | None
    """Seconds a sender's send took (None: no sender finished one)."""
    ran_for: float
    """Seconds from worker 1's ``started`` to its ``completed`` (or its kill)."""
    tail: float
    """Seconds from the message's ``sent`` to worker 1's ``completed`` (or its kill)."""


async def _start(*args: str, env: dict[str, str], stderr: Path) -> ChildProcess:
    return await ChildProcess.spawn(
        *COMMAND, *args, stderr=stderr, env=env, line_timeout=LINE_TIMEOUT
    )


def _checked(process: ChildProcess, code: int, what: str) -> None:
    if code not in (0, -signal.SIGKILL):
        raise AssertionError(f"{what} (pid {process.pid}) exited {code}: {process.stderr_tail()}")


async def run_waits_trial(
    url: str, execution_id: str, directory: Path, kills: Kills, env: dict[str, str]
) -> WaitsTrial:
    """One trial (see the module's docstring)."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    first = await _start(
        "worker", url, execution_id, str(directory), env=env, stderr=directory / "w1.err"
    )
    senders: list[ChildProcess] = []
    sender_death: SenderDeath | None = None
    try:
        line = await first.line()
        assert line == f"started {first.pid}", f"worker 1 said {line!r}"
        began = time.perf_counter()
        sent = asyncio.get_running_loop().create_future()
        spans: list[float] = []

        async def one_send(name: str, kill_after: float | None, *, hold: bool = False) -> int:
            sender = await _start(
                "send",
                url,
                execution_id,
                *(["--hold"] if hold else []),
                env=env,
                stderr=directory / f"{name}.err",
            )
            senders.append(sender)
            ready = await sender.line()
            assert ready == f"ready {sender.pid}", f"{name} said {ready!r}"
            if hold:
                holding = await sender.line()
                assert holding == f"holding {sender.pid}", f"{name} said {holding!r}"
                sender.kill()
            elif kill_after is not None:
                asyncio.get_running_loop().call_later(kill_after, sender.kill)
            said = (await sender.line() or "").split()
            if said[:1] == ["sent"]:
                spans.append(float(said[3]))  # how long its send took, by its own clock
                if not sent.done():
                    sent.set_result(time.perf_counter())
            code = await sender.finish()
            _checked(sender, code, name)
            return code

        async def send() -> None:
            nonlocal sender_death
            await asyncio.sleep(kills.send_after)
            if kills.hold_sender:
                # Killed where it stopped, its message stored, neither delivered nor its row
                # written again; nobody sends it again.
                assert await one_send("s1", None, hold=True) == -signal.SIGKILL
                sender_death = "held after storing"
                sent.set_result(time.perf_counter())
                return
            if await one_send("s1", kills.sender_after) != -signal.SIGKILL:
                return
            if sent.done():
                sender_death = "after sent"
                return
            async with open_storage(url) as storage:
                stored = bool(await storage.events.read(f"$inbox:{execution_id}"))
            if stored:
                # Nobody sends it again: the wake row it wrote first must deliver it.
                sender_death = "after storing"
                sent.set_result(time.perf_counter())
            else:
                sender_death = "before storing"
                assert await one_send("s2", None) == 0

        async def kill_worker() -> tuple[float, float]:
            if kills.worker_after is None:
                try:
                    line = await first.line()
                except TimeoutError:
                    raise AssertionError(
                        f"worker 1 did not complete in {LINE_TIMEOUT:.0f} s (a message "
                        f"undelivered?); its stderr: {first.stderr_tail()}"
                    ) from None
                assert (line or "").startswith("completed"), (
                    f"worker 1 said {line!r}; its stderr: {first.stderr_tail()}"
                )
            else:
                if kills.from_sent:
                    await sent
                await asyncio.sleep(kills.worker_after)
                first.kill()
            now = time.perf_counter()
            return now - began, now - await sent

        _, (ran_for, tail) = await asyncio.gather(send(), kill_worker())
        code = await first.finish()
    finally:
        first.kill()
        for sender in senders:
            sender.kill()
    _checked(first, code, "worker 1")
    workers = [Worker.of(0, first, "started")]

    second = await _start(
        "worker", url, execution_id, str(directory), env=env, stderr=directory / "w2.err"
    )
    try:
        line = await second.line()
        assert line == f"recovering {second.pid}", f"worker 2 said {line!r}"
        code = await second.finish()
    finally:
        second.kill()
    assert code == 0, second.stderr_tail()
    workers.append(Worker.of(1, second, "recovering"))

    async with open_storage(url) as storage:
        log = await storage.events.read(execution_id)
        inbox = await storage.events.read(f"$inbox:{execution_id}")
    trial = Trial(
        execution_id,
        2,
        tuple(workers),
        log,
        _traces(directory),
        _counters(directory),
        ran_for,
    )
    consumed = tuple(
        e.payload.get("value")
        for e in log
        if e.kind == EventKind.MESSAGE_CONSUMED and isinstance(e.payload, dict)
    )
    return WaitsTrial(
        trial,
        len(inbox),
        consumed,
        _sleep(log),
        len(senders),
        sender_death,
        min(spans, default=None),
        ran_for,
        tail,
    )


def _traces(directory: Path) -> tuple[Trace, ...]:
    path = directory / "trace.log"
    if not path.exists():
        return ()
    traces = []
    for line in path.read_text().splitlines():
        step, pid, what = line.split()
        assert what in ("start", "replayed")
        traces.append(Trace(step, int(pid), "start" if what == "start" else "replayed"))
    return tuple(traces)


def _counters(directory: Path) -> dict[str, int]:
    path = directory / "counters.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _sleep(log: tuple[Event, ...]) -> tuple[datetime, datetime] | None:
    """The sleep's wake time, and when the resume that answered it was recorded."""
    wake: datetime | None = None
    for event in log:
        kind, payload = event.kind, event.payload
        if kind == EventKind.EXECUTION_SUSPENDED and isinstance(payload, dict) and wake is None:
            waits = payload.get("waits")
            for wait in waits if isinstance(waits, list) else []:
                if isinstance(wait, dict) and wait.get("wake_at"):
                    wake = datetime.fromisoformat(str(wait["wake_at"]))
        elif kind == EventKind.EXECUTION_RESUMED and wake is not None:
            return wake, event.recorded_at
    return None


def waits_violations(done: WaitsTrial) -> list[str]:
    """Every way the trial broke its promises (see the module's docstring)."""
    found = violations(done.trial)
    if done.messages != 1:
        found.append(f"the inbox holds {done.messages} messages, not the one sent")
    if done.consumed != (VALUE,):
        found.append(f"the log consumed {list(done.consumed)}, not {VALUE} once")
    if done.sleep is None:
        found.append("no resume answers the sleep")
    elif done.sleep[1] < done.sleep[0]:
        found.append(f"the sleep due at {done.sleep[0]} was answered at {done.sleep[1]}")
    return found


# -- trials at random points -----------------------------------------------------------------


@dataclass(slots=True)
class Summary:
    """What the kills hit, for the test's report line (never asserted: timing)."""

    seed: int
    window: float = 0.0
    tail: float = 0.0
    send_span: float = 0.0
    trials: int = 0
    deaths: int = 0
    senders_killed: Counter[SenderDeath] = field(default_factory=Counter)
    landed: Counter[str] = field(default_factory=Counter)

    def line(self, backend: str) -> str:
        spread = ", ".join(f"{where}: {n}" for where, n in sorted(self.landed.items()))
        senders = ", ".join(
            f"{where}: {self.senders_killed[where]}" for where in get_args(SenderDeath)
        )
        return (
            f"\n{backend}, a sleep and a message: seed {self.seed}; {self.deaths} workers "
            f"and {self.senders_killed.total()} senders SIGKILLed (within a "
            f"{self.send_span * 1000:.1f} ms send: {senders}) in {self.trials} trials over a "
            f"{self.window * 1000:.0f} ms window ({self.tail * 1000:.0f} ms after the "
            f"message was stored). Where worker 1 died: {spread}"
        )


def _landed(done: WaitsTrial) -> str:
    """Where worker 1 died: parked, or running with so many steps recorded (and the
    message consumed)."""
    recorded = recorded_by_first(done.trial)
    kinds = [e.kind for e in done.trial.log]
    recovered = (
        kinds.index(EventKind.EXECUTION_RECOVERED)
        if EventKind.EXECUTION_RECOVERED in kinds
        else None
    )
    if recovered is None:
        return "parked"  # nothing to recover: a worker's timers answered the park
    consumed = EventKind.MESSAGE_CONSUMED in kinds[:recovered]
    return f"{recorded} steps{', message consumed' if consumed and recorded < 2 else ''}"


async def kill_around_waits(
    url_for: Callable[[int], Awaitable[str]],
    root: Path,
    *,
    deaths: int,
    seed: int,
) -> Summary:
    """Run trials until ``deaths`` workers died of their kill; raise AssertionError with
    every violation of every trial (and the seed) if any trial broke a promise."""
    rng = random.Random(seed)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    summary = Summary(seed)
    failures: dict[str, list[str]] = {}

    async def trial(index: int, kills: Kills) -> WaitsTrial:
        done = await run_waits_trial(
            await url_for(index), f"waits-{index}", root / f"trial-{index}", kills, env
        )
        found = waits_violations(done)
        if found:
            failures[f"waits-{index} ({kills})"] = found
        return done

    calibration = [
        await trial(-1 - n, Kills(0.0, None, None)) for n in range(CALIBRATION_RUNS)
    ]
    # The sender starts at once here: the window is the run with its message on time, the
    # tail what is left of it once the message is stored.
    summary.window = min(t.ran_for for t in calibration)
    summary.tail = min(t.tail for t in calibration)
    summary.send_span = min(t.send_span or LINE_TIMEOUT for t in calibration)
    cap = deaths * 3
    in_flight = 0

    async def lane() -> None:
        nonlocal in_flight
        while summary.deaths + in_flight < deaths and summary.trials < cap:
            index = summary.trials
            summary.trials += 1
            from_sent = rng.random() < 0.5
            hold = rng.random() < HELD_SENDERS
            kills = Kills(
                send_after=rng.uniform(0, summary.window),
                # Not from the message: within its first step, its sleep and its park,
                # before the sender (a process start away) can have stored anything.
                # A held sender's trial leaves worker 1 alive: a restarted node would put
                # the wake row back; here only the row the sender wrote first delivers.
                worker_after=(
                    None if hold else rng.uniform(0, summary.tail if from_sent else EARLY)
                ),
                sender_after=(
                    rng.uniform(0, SEND_KILL_SPANS * summary.send_span)
                    if not hold and rng.random() < 0.5
                    else None
                ),
                from_sent=from_sent,
                hold_sender=hold,
            )
            in_flight += 1
            try:
                done = await trial(index, kills)
            finally:
                in_flight -= 1
            if done.sender_death is not None:
                summary.senders_killed[done.sender_death] += 1
            if done.trial.workers[0].killed:
                summary.deaths += 1
                summary.landed[_landed(done)] += 1

    await asyncio.gather(*(lane() for _ in range(LANES)))
    assert not failures, f"seed {seed}: trials broke a promise: {failures}"
    assert summary.deaths == deaths, (
        f"seed {seed}: only {summary.deaths} of {summary.trials} kills landed before "
        "worker 1 exited"
    )
    return summary


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
