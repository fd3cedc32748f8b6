"""The schedule explorer: every interleaving of two resumers, with crashes.

The model, precisely:

* **Setup** (per schedule, on a fresh storage, or on a fresh execution id with
  ``isolation="execution"``): an execution is started and parked (EXECUTION_STARTED,
  EXECUTION_SUSPENDED at sequence 1, both unfenced, so the park's token is 0), an unfenced
  EXECUTION_DENIED follows the park (an audit append that must not make anything stale),
  and a *dead acquirer* took token 1 and crashed without appending (with
  ``acquire_fence_if`` in the conditional run, ``acquire_fence`` in the control). Every
  resumer therefore starts from a stale envelope token, so the retry with the returned token
  (docs/design.md, "The conditional acquire") is on the path of every schedule.
* **Two resumers, A and B**, run the same program, one store call per step:

  1. *read*: read the log, find the newest park; stop if it is answered;
  2. *acquire*: ``acquire_fence_if(id, fence=<park's token>, park_seq=<park>)``; on
     stale, if attempts remain (3 in all), go to 3 with the token the store returned;
     (the control calls the unconditional ``acquire_fence`` instead);
  3. *re-read*: read the log; if the same park is still the newest and unanswered, go
     back to 2, else stop (the park was answered: not-suspended);
  4. *resume*: append EXECUTION_RESUMED under the acquired token; a conflict (a rival
     fenced it, or wrote first) goes to 3;
  5. *run*: append STEP_COMPLETED under the token, twice (the resumed body running on).
* **A schedule** is a word over {A, B} of length 0 to ``max_steps`` (10): the letter X
  means "X takes its next step"; a letter for an actor that has stopped is a no-op.
  Whatever an actor has not done when the word ends it never does: it crashed there, and
  the store keeps everything it did (a token it took, events it appended). Every word of
  every length is run, so every crash point of either actor, or both, is covered.
  The count is 2^0 + 2^1 + … + 2^10 = 2^11 - 1 = **2,047** schedules (words are not
  de-duplicated after both actors stop, so the count is exactly the word count).
* **Checked after every schedule**: at most one EXECUTION_RESUMED answers the park; and a
  resumer whose EXECUTION_RESUMED landed is never refused later (StaleFenceError, or any
  conflict, on its running body): the winner's body is never fenced out.

The conditional run must find no violation; the negative control (the same schedules with
the unconditional ``acquire_fence``) must find at least one: a rival that read the park
before the winner's resume landed takes a newer token and fences the running body out.

Run it from a shell: ``python -m loom_conformance.explorer [--url URL]``.

The model above is a copy of a resumer, small enough to read in one screen. To explore the
*real* code instead (a runtime's resume, driven through its own store calls), use
:mod:`loom_conformance.explorer.interleaving`: :class:`Interleaving` pauses each actor at
every call it makes through a gated store, plays a word over the actors with crashes, and
:func:`every_interleaving` walks every distinct schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from loom_conformance.explorer.interleaving import (
    Call,
    GatedEventStore,
    Interleaving,
    Outcome,
    Played,
    ScheduleError,
    every_interleaving,
)
from loom_conformance.factory import StorageFactory, memory_factory
from loom_core import (
    ConflictError,
    Event,
    EventKind,
    EventStore,
    ExecutionAlreadyExistsError,
    FenceAcquired,
    InvalidOptionError,
    LoomError,
    NewEvent,
    StaleFenceError,
    Storage,
    Unsupported,
    is_answering,
    open_storage,
)

__all__ = [
    "DEFAULT_MAX_STEPS",
    "Acquire",
    "Call",
    "ExplorationReport",
    "GatedEventStore",
    "Interleaving",
    "Isolation",
    "Outcome",
    "Played",
    "ScheduleError",
    "Violation",
    "every_interleaving",
    "explore",
    "main",
    "schedules",
]

DEFAULT_MAX_STEPS: Final = 10
MAX_ACQUIRE_ATTEMPTS: Final = 3
BODY_STEPS: Final = 2
PARK_SEQ: Final = 1
ACTORS: Final = ("A", "B")

Acquire: TypeAlias = Literal["acquire_fence_if", "acquire_fence"]
Isolation: TypeAlias = Literal["store", "execution"]

RULE_ONE_RESUME: Final = "at most one EXECUTION_RESUMED answers the park"
RULE_BODY_NOT_FENCED: Final = "the winner's running body is never fenced out"


@dataclass(frozen=True, slots=True)
class Violation:
    """One schedule that broke a rule, with what each step did."""

    schedule: str
    rule: str
    trace: tuple[str, ...]

    def explain(self) -> str:
        steps = "\n".join(f"    {line}" for line in self.trace)
        return f"schedule {self.schedule or '(empty)'} breaks the rule: {self.rule}\n{steps}"


@dataclass(frozen=True, slots=True)
class ExplorationReport:
    """What :func:`explore` found. ``resumed`` counts schedules in which a resume landed
    and ``retried`` those in which a stale acquire was retried with the returned token,
    which shows the exploration reached the interesting states."""

    acquire: Acquire
    max_steps: int
    schedules: int
    resumed: int
    retried: int
    violations: tuple[Violation, ...]

    @property
    def summary(self) -> str:
        return f"{self.schedules} schedules, {len(self.violations)} violations"


def schedules(max_steps: int = DEFAULT_MAX_STEPS) -> Iterator[str]:
    """Every word over {A, B} of length 0 to ``max_steps``, shortest first."""
    for length in range(max_steps + 1):
        for word in itertools.product(ACTORS, repeat=length):
            yield "".join(word)


def _newest_park(log: Sequence[Event]) -> tuple[Event | None, bool]:
    """The newest EXECUTION_SUSPENDED and whether it is still unanswered."""
    for index in range(len(log) - 1, -1, -1):
        if log[index].kind == EventKind.EXECUTION_SUSPENDED:
            answered = any(is_answering(e) for e in log[index + 1 :])
            return log[index], not answered
    return None, False


@dataclass(slots=True)
class _Resumer:
    name: str
    store: EventStore
    execution_id: str
    acquire: Acquire
    trace: list[str]
    state: str = "read"
    park_seq: int = 0
    fence: int = 0
    token: int = 0
    head: int = 0
    attempts: int = 0
    body: int = 0
    resumed: bool = False
    retried: bool = False
    violations: list[str] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        return self.state == "stopped"

    def _say(self, line: str) -> None:
        self.trace.append(f"{self.name} {line}")

    def _stop(self, why: str) -> None:
        self._say(f"stops: {why}")
        self.state = "stopped"

    async def step(self) -> None:
        if self.state == "read":
            await self._read()
        elif self.state == "acquire":
            await self._acquire()
        elif self.state == "reread":
            await self._reread()
        elif self.state == "resume":
            await self._resume()
        elif self.state == "run":
            await self._run()
        else:
            self._say("(stopped: no-op)")

    async def _read(self) -> None:
        log = await self.store.read(self.execution_id)
        parked, open_ = _newest_park(log)
        if parked is None or not open_:
            self._say("read: no unanswered park")
            self._stop("not suspended")
            return
        self.park_seq, self.fence, self.head = parked.sequence, parked.fence, len(log)
        self._say(f"read: park at {self.park_seq} written under token {self.fence}")
        self.state = "acquire"

    async def _acquire(self) -> None:
        self.attempts += 1
        if self.acquire == "acquire_fence":
            self.token = await self.store.acquire_fence(self.execution_id)
            self._say(f"acquire_fence -> token {self.token}")
            self.state = "resume"
            return
        result = await self.store.acquire_fence_if(
            self.execution_id, fence=self.fence, park_seq=self.park_seq
        )
        if isinstance(result, FenceAcquired):
            self.token = result.fence
            self._say(
                f"acquire_fence_if(fence={self.fence}, park_seq={self.park_seq}) "
                f"-> acquired token {self.token}"
            )
            self.state = "resume"
            return
        self._say(
            f"acquire_fence_if(fence={self.fence}, park_seq={self.park_seq}) "
            f"-> stale, current token {result.fence}"
        )
        self.fence = result.fence
        self._retry_or_stop()

    def _retry_or_stop(self) -> None:
        if self.attempts >= MAX_ACQUIRE_ATTEMPTS:
            self._stop("contended (attempts exhausted)")
        else:
            self.state = "reread"

    async def _reread(self) -> None:
        log = await self.store.read(self.execution_id)
        parked, open_ = _newest_park(log)
        if parked is None or parked.sequence != self.park_seq or not open_:
            self._say("re-read: the park was answered")
            self._stop("not suspended")
            return
        self.head = len(log)
        self._say(f"re-read: park at {self.park_seq} still unanswered; retry")
        self.retried = True
        self.state = "acquire"

    async def _resume(self) -> None:
        try:
            await self.store.append(
                self.execution_id,
                [NewEvent(EventKind.EXECUTION_RESUMED.value, {"by": self.name})],
                expected_sequence=self.head,
                fence=self.token,
            )
        except ConflictError as exc:
            self._say(f"append EXECUTION_RESUMED under {self.token} refused: {type(exc).__name__}")
            if isinstance(exc, StaleFenceError):
                self.fence = exc.current_fence
            self._retry_or_stop()
            return
        self.head += 1
        self.resumed = True
        self._say(f"append EXECUTION_RESUMED under token {self.token}: landed")
        self.state = "run"

    async def _run(self) -> None:
        try:
            await self.store.append(
                self.execution_id,
                [NewEvent(EventKind.STEP_COMPLETED.value, {"by": self.name, "step": self.body})],
                expected_sequence=self.head,
                fence=self.token,
            )
        except ConflictError as exc:
            self._say(f"append STEP_COMPLETED under token {self.token} refused: {exc}")
            self.violations.append(RULE_BODY_NOT_FENCED)
            self._stop("fenced out while running")
            return
        self.head += 1
        self.body += 1
        self._say(f"append STEP_COMPLETED under token {self.token}: landed")
        if self.body >= BODY_STEPS:
            self._stop("body finished")


async def _setup(store: EventStore, execution_id: str, acquire: Acquire) -> None:
    await store.append(
        execution_id,
        [
            NewEvent(EventKind.EXECUTION_STARTED.value),
            NewEvent(EventKind.EXECUTION_SUSPENDED.value, {"waiting_on": "children"}),
        ],
        expected_sequence=0,
    )
    await store.append(
        execution_id, [NewEvent(EventKind.EXECUTION_DENIED.value)], expected_sequence=2
    )
    # The dead acquirer: takes token 1 and crashes before appending anything.
    if acquire == "acquire_fence":
        await store.acquire_fence(execution_id)
    else:
        await store.acquire_fence_if(execution_id, fence=0, park_seq=PARK_SEQ)


async def _run_schedule(
    store: EventStore, execution_id: str, schedule: str, acquire: Acquire
) -> tuple[list[Violation], bool, bool]:
    await _setup(store, execution_id, acquire)
    trace: list[str] = []
    actors = {name: _Resumer(name, store, execution_id, acquire, trace) for name in ACTORS}
    for letter in schedule:
        await actors[letter].step()
    found = [
        Violation(schedule, rule, tuple(trace)) for a in actors.values() for rule in a.violations
    ]
    log = await store.read(execution_id, from_sequence=PARK_SEQ + 1)
    resumes = sum(e.kind == EventKind.EXECUTION_RESUMED for e in log)
    if resumes > 1:
        found.append(Violation(schedule, RULE_ONE_RESUME, (*trace, f"log: {resumes} resumes")))
    return (
        found,
        any(a.resumed for a in actors.values()),
        any(a.retried for a in actors.values()),
    )


async def explore(
    factory: StorageFactory,
    *,
    acquire: Acquire = "acquire_fence_if",
    max_steps: int = DEFAULT_MAX_STEPS,
    isolation: Isolation = "store",
) -> ExplorationReport:
    """Run every schedule (see the module docstring) against stores from ``factory``.

    ``acquire="acquire_fence"`` is the negative control. ``isolation="store"`` opens a
    fresh storage per schedule; ``"execution"`` runs each schedule on its own execution id
    in one storage. Raises :class:`~loom_core.Unsupported` if the store does not offer
    ``acquire``.
    """
    if isolation not in ("store", "execution"):
        raise ValueError(f"isolation must be 'store' or 'execution', not {isolation!r}")
    shared: Storage = await factory()
    try:
        if acquire not in shared.events.capabilities:
            raise Unsupported(
                acquire, type(shared.events).__name__, "the schedule explorer needs it"
            )
        violations: list[Violation] = []
        count = resumed = retried = 0
        for index, schedule in enumerate(schedules(max_steps)):
            if isolation == "store":
                storage = await factory()
                try:
                    await _refuse_a_used_storage(storage)
                    found, did_resume, did_retry = await _run_schedule(
                        storage.events, "explored", schedule, acquire
                    )
                finally:
                    await storage.close()
            else:
                found, did_resume, did_retry = await _run_schedule(
                    shared.events, f"explored-{acquire}-{index:05d}", schedule, acquire
                )
            count += 1
            resumed += did_resume
            retried += did_retry
            violations.extend(found)
    finally:
        await shared.close()
    return ExplorationReport(acquire, max_steps, count, resumed, retried, tuple(violations))


async def _refuse_a_used_storage(storage: Storage) -> None:
    """Refuse, saying what to change, a storage that ``isolation="store"`` was handed
    already holding logs: each schedule starts the same execution, so on a store that
    keeps what the schedule before wrote the second schedule would fail with an
    ExecutionAlreadyExistsError that names neither the factory nor the isolation."""
    held = await storage.events.list_executions(limit=3)
    if held:
        raise InvalidOptionError(
            "isolation='store' runs each schedule on a fresh storage from the factory, but "
            f"it returned one that already holds executions ({', '.join(map(repr, held))}): "
            "make each call open a new, empty storage (a new file, schema or database), or "
            "explore with isolation='execution' (in pytest, override the "
            "loom_explorer_isolation fixture to return 'execution'; from a shell, "
            "--isolation execution)"
        )


def _factory_for(url: str | None) -> StorageFactory:
    if url is None:
        return memory_factory()

    async def open_url() -> Storage:
        return await open_storage(url)

    return open_url


async def _main(url: str | None, max_steps: int, isolation: Isolation) -> int:
    factory = _factory_for(url)
    conditional = await explore(factory, max_steps=max_steps, isolation=isolation)
    print(f"acquire_fence_if: {conditional.summary}")
    print(
        f"  ({conditional.resumed} schedules landed a resume, {conditional.retried} retried "
        "a stale acquire with the returned token)"
    )
    for violation in conditional.violations[:1]:
        print(violation.explain())
    control = await explore(
        factory, acquire="acquire_fence", max_steps=max_steps, isolation=isolation
    )
    print(f"negative control, unconditional acquire_fence: {control.summary}")
    if control.violations:
        print("  first: " + control.violations[0].explain())
    return 0 if not conditional.violations and control.violations else 1


def _steps(text: str) -> int:
    try:
        steps = int(text)
    except ValueError:
        steps = -1
    if steps < 0:
        raise argparse.ArgumentTypeError(f"must be a schedule length of 0 or more, not {text!r}")
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loom_conformance.explorer [--url URL] [--steps N]``; exit status 0 when
    the conditional run is clean and the control finds a violation, 2 when the store
    cannot be explored (its URL does not open, or it refuses a call with a LoomError)."""
    parser = argparse.ArgumentParser(
        prog="python -m loom_conformance.explorer",
        description="Explore every interleaving of two resumers of a park against a store.",
    )
    parser.add_argument("--url", help="storage URL (default: memory://)")
    parser.add_argument(
        "--steps", type=_steps, default=DEFAULT_MAX_STEPS, help="max schedule length"
    )
    parser.add_argument(
        "--isolation", choices=("store", "execution"),
        help=(
            "a fresh storage per schedule (the default without --url: memory:// opens "
            "empty each time) or a fresh execution id in one storage (the default with "
            "--url: a file or a server keeps what the schedule before wrote)"
        ),
    )
    args = parser.parse_args(argv)
    chosen = args.isolation or ("store" if args.url is None else "execution")
    isolation: Isolation = "execution" if chosen == "execution" else "store"
    try:
        return asyncio.run(_main(args.url, args.steps, isolation))
    except ExecutionAlreadyExistsError as exc:
        parser.exit(
            2,
            f"{parser.prog}: {exc}: "
            + (
                "with --isolation store each schedule opens the URL again and starts the "
                "same execution there, which a store that keeps its data already holds; "
                "use --isolation execution\n"
                if isolation == "store"
                else "the store holds an earlier exploration's executions; give the "
                "explorer an empty one\n"
            ),
        )
    except LoomError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
