"""Pausing real code at its store calls: :class:`Interleaving` and :class:`GatedEventStore`.

The store-level explorer (:func:`loom_conformance.explorer.explore`) runs a model of a
resumer, one store call per step. This module runs *real* code the same way: each
*actor* is a coroutine (a runtime's resume, a sender, a recovery) run in its own task,
and every call it makes through a :class:`GatedEventStore` waits for the actor's turn.
A *word* over the actors' names (one character each) is the schedule: the letter X lets
X's pending store call reach the store, then waits until X is blocked at its next call
or has finished. When the word ends, every actor that still has a call pending is
**crashed** there: its task is cancelled at that call, which never reaches the store, and
nothing it would have done afterwards happens (the store keeps everything it did do:
tokens taken, events written).

::

    interleaving = Interleaving()
    gated = interleaving.gate(storage.events)        # hand ``gated`` to the code under test
    played = await interleaving.play("AAB", {"A": resume_a, "B": resume_b})
    played.outcomes["B"].kind                         # "returned", "raised" or "crashed"

:func:`every_interleaving` walks every distinct schedule once: it starts from the empty
word and extends a word by each actor that was still pending when it ended, so no word
contains a letter for an actor that had already finished, and every crash point of every
actor, alone or together, is a schedule of its own.

The model asks two things of the code under exploration, and refuses (with
:class:`ScheduleError`) code that breaks them: an actor makes one store call at a time
(code that fans out must await what it starts, e.g. a runtime's ``drain()``), and it
neither calls the store after its coroutine has returned nor waits on anything but the
store (a wait on another actor would never end; :attr:`Interleaving.guard_seconds` turns
that hang into an error, and is never an assertion about speed). Timer calls are not
steps of the word, but a :class:`TrackedTimerStore` makes the schedule wait for an
actor's timer call to finish before it counts the actor as blocked (on a file-backed store
that call is real I/O, during which a task the actor started may already wait at the
gate). Calls made outside any actor (setting a schedule up, checking it afterwards) go
straight to the store.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal, TypeVar

from loom_core import AppendRequest, Event, EventStore, NewEvent, Storage, TimerRecord, TimerStore
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Implement
from loom_core.spi import ConditionalFence

__all__ = [
    "GUARD_SECONDS",
    "Call",
    "GatedEventStore",
    "Interleaving",
    "Outcome",
    "Played",
    "ScheduleError",
    "TrackedTimerStore",
    "every_interleaving",
]

GUARD_SECONDS: Final = 10.0
"""How long an actor may run between two store calls before it is called hung."""

_T = TypeVar("_T")

_ACTOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "loom_conformance_actor", default=None
)


class ScheduleError(AssertionError):
    """The code under exploration broke the model (two store calls at once from one actor,
    a call after its actor finished, an unknown actor) or hung between two calls."""


@dataclass(frozen=True, slots=True)
class Call:
    """One store call that reached the store, with what it returned or raised."""

    actor: str
    method: str
    execution_id: str
    arguments: Mapping[str, object]
    result: object = None
    error: BaseException | None = None

    @property
    def refused(self) -> bool:
        return self.error is not None

    def written(self) -> tuple[Event, ...]:
        """The events this call wrote: an append's (or ``append_many``'s), none for a
        refused call or one that writes no events."""
        if self.error is not None or not isinstance(self.result, tuple):
            return ()
        if self.method in ("append", "append_if_unchanged"):
            return tuple(e for e in self.result if isinstance(e, Event))
        if self.method == "append_many":
            return tuple(
                e for batch in self.result if isinstance(batch, tuple)
                for e in batch if isinstance(e, Event)
            )
        return ()

    def describe(self) -> str:
        outcome = (
            f"raised {type(self.error).__name__}" if self.error is not None
            else f"-> {_render(self.result)}"
        )
        signature = _signature(self.method, self.execution_id, self.arguments)
        return f"{self.actor} {signature} {outcome}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an actor ended: its coroutine ``returned`` ``value``, ``raised`` ``error``, or
    was ``crashed`` with ``pending`` (the call it was waiting to make) never made."""

    kind: Literal["returned", "raised", "crashed"]
    value: object = None
    error: BaseException | None = None
    pending: str = ""

    def describe(self) -> str:
        if self.kind == "returned":
            return f"returned {_render(self.value)}"
        if self.kind == "raised":
            return f"raised {type(self.error).__name__}: {self.error}"
        return f"crashed before {self.pending}"


@dataclass(frozen=True, slots=True)
class Played:
    """One schedule's run: the calls that reached the store, in order, and each actor's
    outcome."""

    word: str
    calls: tuple[Call, ...]
    outcomes: Mapping[str, Outcome]

    @property
    def crashed(self) -> frozenset[str]:
        """The actors that still had a call pending when the word ended."""
        return frozenset(n for n, o in self.outcomes.items() if o.kind == "crashed")

    def by(self, actor: str) -> tuple[Call, ...]:
        return tuple(c for c in self.calls if c.actor == actor)

    def explain(self) -> str:
        lines = [f"schedule {self.word or '(empty)'}:"]
        lines += [f"    {call.describe()}" for call in self.calls]
        lines += [f"    {name}: {o.describe()}" for name, o in sorted(self.outcomes.items())]
        return "\n".join(lines)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[None]
    description: str
    task: asyncio.Task[object] | None


@dataclass(slots=True)
class _Actor:
    name: str
    task: asyncio.Task[object]
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    pending: _Pending | None = None
    in_flight: int = 0
    crashed: bool = False

    def finished(self, _: asyncio.Task[object]) -> None:
        self.moved.set()

    @property
    def quiet(self) -> bool:
        """Blocked at its next gated call, or finished, with no timer call under way."""
        return self.in_flight == 0 and (self.pending is not None or self.task.done())


class Interleaving:
    """Runs actors one store call at a time, in the order a word gives; see the module
    docstring. One :meth:`play` at a time; the gated stores it hands out may be reused
    across plays."""

    def __init__(self, *, guard_seconds: float = GUARD_SECONDS) -> None:
        self.guard_seconds = guard_seconds
        self._actors: dict[str, _Actor] = {}
        self._calls: list[Call] = []
        self._broken: list[ScheduleError] = []
        self._playing = False

    def gate(self, store: EventStore) -> GatedEventStore:
        """``store`` with every call of an actor waiting for the actor's turn."""
        return GatedEventStore(store, self)

    def track(self, timers: TimerStore) -> TrackedTimerStore:
        """``timers`` with every call of an actor waited for (see
        :class:`TrackedTimerStore`)."""
        return TrackedTimerStore(timers, self)

    def storage(self, storage: Storage) -> Storage:
        """``storage`` with its event store gated and its timer store tracked (leases are
        neither: nothing the explorer checks is ordered by them). Closing the result closes
        ``storage``'s stores."""
        return Storage(
            self.gate(storage.events), self.track(storage.timers), storage.leases,
            url=storage.url,
        )

    async def tracked(self, run: Callable[[], Awaitable[_T]]) -> _T:
        """Make an actor's call that is not a step of the word (a timer call) at once, and
        count it as under way, so the actor is not taken for blocked while it runs."""
        name = _ACTOR.get()
        if name is None:
            return await run()
        actor = self._actors.get(name)
        if actor is None or not self._playing:
            raise self._broke(
                f"a timer call was made by actor {name!r}, which is not in the schedule "
                "being played (a task left behind by an earlier play?)"
            )
        if actor.crashed:
            raise asyncio.CancelledError
        actor.in_flight += 1
        try:
            return await run()
        finally:
            actor.in_flight -= 1
            actor.moved.set()

    async def call(
        self,
        method: str,
        execution_id: str,
        arguments: Mapping[str, object],
        run: Callable[[], Awaitable[_T]],
    ) -> _T:
        """Wait for the calling actor's turn, then make the call and record it."""
        name = _ACTOR.get()
        if name is None:
            return await run()
        await self._turn(name, _signature(method, execution_id, arguments))
        try:
            result = await run()
        except Exception as exc:
            self._calls.append(Call(name, method, execution_id, arguments, error=exc))
            raise
        self._calls.append(Call(name, method, execution_id, arguments, result=result))
        return result

    def _broke(self, message: str) -> ScheduleError:
        """Record a broken rule (the call that broke it may be in a task no one awaits, so
        :meth:`play` raises it too) and return the error to raise there."""
        error = ScheduleError(message)
        self._broken.append(error)
        return error

    async def _turn(self, name: str, description: str) -> None:
        actor = self._actors.get(name)
        if actor is None or not self._playing:
            raise self._broke(
                f"{description} was called by actor {name!r}, which is not in the schedule "
                "being played (a task left behind by an earlier play?)"
            )
        if actor.crashed:
            raise asyncio.CancelledError  # a crashed actor makes no more calls
        if actor.task.done():
            raise self._broke(
                f"actor {name!r} finished, but a task it started called {description}: an "
                "actor must await everything it starts"
            )
        if actor.pending is not None:
            raise self._broke(
                f"actor {name!r} called {description} while {actor.pending.description} was "
                "still waiting for its turn: an actor makes one store call at a time"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        actor.pending = _Pending(future, description, asyncio.current_task())
        actor.moved.set()
        await future

    async def _settle(self, actor: _Actor) -> None:
        """Wait until ``actor`` is blocked at its next call or has finished."""
        hung = False

        def give_up() -> None:
            nonlocal hung
            hung = True
            actor.moved.set()

        watchdog = asyncio.get_running_loop().call_later(self.guard_seconds, give_up)
        try:
            while not actor.quiet:
                await actor.moved.wait()
                actor.moved.clear()
                if hung:
                    raise ScheduleError(
                        f"actor {actor.name!r} neither called the store nor finished within "
                        f"{self.guard_seconds} s: is it waiting on another actor?"
                    )
        finally:
            watchdog.cancel()

    async def play(
        self, word: str, actors: Mapping[str, Callable[[], Awaitable[object]]]
    ) -> Played:
        """Start every actor (each runs up to its first store call), give one call per
        letter of ``word``, then crash every actor with a call still pending. Each actor
        is named by one character, its letter in the word.

        A letter for an actor that has finished is a no-op; a letter that names no actor
        is refused with :class:`ScheduleError`.
        """
        if self._playing:
            raise ScheduleError("Interleaving.play is already running; play one at a time")
        long = sorted(name for name in actors if len(name) != 1)
        if long:
            raise ScheduleError(f"actors are named by one letter of the word, not {long}")
        unknown = sorted(set(word) - set(actors))
        if unknown:
            raise ScheduleError(f"the word {word!r} names no actor {unknown}")
        self._raise_broken()
        self._playing = True
        self._calls = []
        self._actors = {}
        try:
            for name, start in actors.items():
                context = contextvars.copy_context()
                context.run(_ACTOR.set, name)
                task: asyncio.Task[object] = asyncio.create_task(_run(start), context=context)
                actor = _Actor(name, task)
                task.add_done_callback(actor.finished)
                self._actors[name] = actor
                await self._settle(actor)
            for letter in word:
                await self._step(self._actors[letter])
            played = await self._crash_and_collect(word)
            self._raise_broken()
            return played
        finally:
            for actor in self._actors.values():
                if not actor.task.done():  # only after a ScheduleError: leave nothing behind
                    actor.crashed = True
                    actor.task.cancel()
            await asyncio.gather(*(a.task for a in self._actors.values()), return_exceptions=True)
            self._playing = False

    def _raise_broken(self) -> None:
        if self._broken:
            first, self._broken = self._broken[0], []
            raise ScheduleError(str(first))

    async def _step(self, actor: _Actor) -> None:
        pending = actor.pending
        if pending is None:
            return  # finished: a no-op
        actor.pending = None
        actor.moved.clear()
        pending.future.set_result(None)
        await self._settle(actor)

    async def _crash_and_collect(self, word: str) -> Played:
        crashed = {n: a.pending.description for n, a in self._actors.items() if a.pending}
        tasks = [a.task for a in self._actors.values()]
        for name in crashed:
            actor = self._actors[name]
            actor.crashed = True
            actor.task.cancel()
            # The call may be a task the actor started (a runtime's run of the body), which
            # the actor's own task may not be awaiting at this instant: crash it too.
            waiting = actor.pending.task if actor.pending is not None else None
            if waiting is not None and waiting is not actor.task:
                waiting.cancel()
                tasks.append(waiting)
        try:
            await asyncio.wait_for(
                asyncio.gather(*tasks, return_exceptions=True), self.guard_seconds
            )
        except TimeoutError:
            raise ScheduleError(
                f"crashed actors {sorted(crashed)} did not stop within {self.guard_seconds} s"
            ) from None
        outcomes: dict[str, Outcome] = {}
        for name, actor in self._actors.items():
            if name in crashed:
                outcomes[name] = Outcome("crashed", pending=crashed[name])
            elif actor.task.cancelled():
                raise ScheduleError(f"actor {name!r} was cancelled by something else")
            elif (error := actor.task.exception()) is not None:
                outcomes[name] = Outcome("raised", error=error)
            else:
                outcomes[name] = Outcome("returned", value=actor.task.result())
        return Played(word, tuple(self._calls), outcomes)


async def _run(start: Callable[[], Awaitable[object]]) -> object:
    return await start()


async def every_interleaving(
    play: Callable[[str], Awaitable[Played]], *, max_steps: int | None = None
) -> AsyncIterator[Played]:
    """Play every distinct schedule once, depth first from the empty word (see the module
    docstring); ``max_steps`` bounds the word's length. ``play`` runs one word on a fresh
    setup (a fresh store, or a fresh execution id)."""
    words = [""]
    while words:
        word = words.pop()
        played = await play(word)
        yield played
        if max_steps is None or len(word) < max_steps:
            words.extend(word + name for name in sorted(played.crashed, reverse=True))


def _render(value: object) -> str:
    if isinstance(value, tuple) and all(isinstance(e, Event) for e in value):
        return "[" + ", ".join(f"{e.sequence}:{e.kind}" for e in value) + "]"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _signature(method: str, execution_id: str, arguments: Mapping[str, object]) -> str:
    rendered = "".join(f", {k}={v!r}" for k, v in arguments.items())
    return f"{method}({execution_id!r}{rendered})"


def _kinds(events: Sequence[NewEvent]) -> tuple[str, ...]:
    return tuple(str(e.kind) for e in events)  # a kernel kind is a StrEnum: its text


class GatedEventStore(EventStoreDecorator):
    """An event store whose every call, when made by an actor of ``interleaving``, waits
    for that actor's turn (``subscribe`` is forwarded ungated: a stream has no one call
    to pause at). Offers exactly what ``inner`` offers."""

    def __init__(self, inner: EventStore, interleaving: Interleaving) -> None:
        super().__init__(inner)
        self.interleaving = interleaving

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        return await self.interleaving.call(
            "append", execution_id,
            {"kinds": _kinds(events), "at": expected_sequence, "fence": fence},
            lambda: self.inner.append(
                execution_id, events, expected_sequence=expected_sequence, fence=fence
            ),
        )

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        return await self.interleaving.call(
            "read", execution_id, {"from": from_sequence},
            lambda: self.inner.read(
                execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
            ),
        )

    async def head(self, execution_id: str) -> int:
        return await self.interleaving.call(
            "head", execution_id, {}, lambda: self.inner.head(execution_id)
        )

    async def list_executions(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[str, ...]:
        return await self.interleaving.call(
            "list_executions", "", {"after": after},
            lambda: self.inner.list_executions(after=after, limit=limit),
        )

    async def acquire_fence(self, execution_id: str) -> int:
        return await self.interleaving.call(
            "acquire_fence", execution_id, {}, lambda: self.inner.acquire_fence(execution_id)
        )

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        return await self.interleaving.call(
            "acquire_fence_if", execution_id, {"fence": fence, "park_seq": park_seq},
            lambda: self.inner.acquire_fence_if(execution_id, fence=fence, park_seq=park_seq),
        )

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        return await self.interleaving.call(
            "append_if_unchanged", execution_id,
            {"kinds": _kinds(events), "at": expected_sequence, "observed_fence": observed_fence},
            lambda: self.inner.append_if_unchanged(
                execution_id, events, expected_sequence=expected_sequence,
                observed_fence=observed_fence,
            ),
        )

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        ids = ", ".join(r.execution_id for r in requests)
        return await self.interleaving.call(
            "append_many", ids, {}, lambda: self.inner.append_many(requests)
        )

    async def delete_execution(self, execution_id: str) -> bool:
        return await self.interleaving.call(
            "delete_execution", execution_id, {},
            lambda: self.inner.delete_execution(execution_id),
        )

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        return await self.interleaving.call(
            "copy_prefix", source, {"target": target, "through": through_sequence},
            lambda: self.inner.copy_prefix(source, target, through_sequence=through_sequence),
        )

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        return await self.interleaving.call(
            "truncate_prefix_keeping", execution_id, {"keep_from": keep_from_sequence},
            lambda: self.inner.truncate_prefix_keeping(
                execution_id, keep_from_sequence=keep_from_sequence
            ),
        )

    decisions = Decisions(
        acquire_fence=Implement(acquire_fence),
        acquire_fence_if=Implement(acquire_fence_if),
        append_if_unchanged=Implement(append_if_unchanged),
        append_many=Implement(append_many),
        delete_execution=Implement(delete_execution),
        copy_prefix=Implement(copy_prefix),
        truncate_prefix_keeping=Implement(truncate_prefix_keeping),
        subscribe=FORWARD,
    )


class TrackedTimerStore:
    """A timer store whose calls, when made by an actor of ``interleaving``, are not steps
    of the word but are waited for: an actor with a timer call under way (real I/O on a
    file-backed store) is not yet blocked, even if a task it started already waits at the
    gate, so the schedule never moves on, or crashes it, in the middle of that call."""

    def __init__(self, inner: TimerStore, interleaving: Interleaving) -> None:
        self.inner = inner
        self.interleaving = interleaving

    async def schedule(self, record: TimerRecord) -> None:
        await self.interleaving.tracked(lambda: self.inner.schedule(record))

    async def due(
        self, now: datetime, *, limit: int = 100, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        return await self.interleaving.tracked(
            lambda: self.inner.due(now, limit=limit, redrive=redrive)
        )

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        return await self.interleaving.tracked(lambda: self.inner.pending(execution_id))

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        return await self.interleaving.tracked(
            lambda: self.inner.complete(execution_id, wake_at)
        )

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        return await self.interleaving.tracked(
            lambda: self.inner.cancel(execution_id, wake_at)
        )

    async def close(self) -> None:
        await self.inner.close()
