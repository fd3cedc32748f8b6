"""The storage contract, defined: :class:`EventStore`, :class:`TimerStore`, :class:`LeaseStore`
and the values they take and return.

This is where the kernel's own modules import the contract from. Store authors import it
from :mod:`loom_core.spi` (users: the Protocols and values from :mod:`loom_core`); this
module's name and layout are private and may change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, Protocol, TypeAlias, get_args, runtime_checkable

from loom_core.events import Event, NewEvent

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "OPTIONAL_EVENT_STORE_METHODS",
    "AppendRequest",
    "ConditionalFence",
    "EventStore",
    "FenceAcquired",
    "FenceStale",
    "Lease",
    "LeaseScope",
    "LeaseStore",
    "OptionalMethod",
    "Redrive",
    "TimerRecord",
    "TimerStore",
]

OptionalMethod: TypeAlias = Literal[
    "acquire_fence",
    "acquire_fence_if",
    "append_if_unchanged",
    "append_many",
    "delete_execution",
    "copy_prefix",
    "truncate_prefix_keeping",
    "subscribe",
]
"""The names of the optional EventStore methods."""

OPTIONAL_EVENT_STORE_METHODS: Final[tuple[OptionalMethod, ...]] = get_args(OptionalMethod)
"""The one registry of optional methods. Adding one here (and to :data:`OptionalMethod`)
breaks every decorator that has not decided it, on purpose."""

DEFAULT_LIST_LIMIT: Final = 100
"""The ``limit`` that ``list_executions`` and ``due`` use when the caller gives none."""


@dataclass(frozen=True, slots=True)
class FenceAcquired:
    """``acquire_fence_if`` won: ``fence`` is the new token."""

    fence: int
    acquired: Literal[True] = True


@dataclass(frozen=True, slots=True)
class FenceStale:
    """``acquire_fence_if`` lost: nothing changed; ``fence`` is the current token."""

    fence: int
    acquired: Literal[False] = False


ConditionalFence: TypeAlias = FenceAcquired | FenceStale


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One execution's part of an ``append_many``."""

    execution_id: str
    events: Sequence[NewEvent]
    expected_sequence: int
    fence: int | None = None


@runtime_checkable
class EventStore(Protocol):
    """An append-only, per-execution event log with fence tokens.

    ``head(id)`` is the sequence the next append must expect: the number of events ever
    appended to the log (0 when it does not exist), unchanged by prefix truncation.
    """

    @property
    def capabilities(self) -> frozenset[OptionalMethod]:
        """The optional methods this instance really offers."""
        ...

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        """Append atomically at ``expected_sequence``, ``expected_sequence + 1``, ….

        Refuses with SequenceConflictError (the head moved), ExecutionAlreadyExistsError
        (``expected_sequence == 0`` and the log exists), StaleFenceError (``fence`` below
        the execution's token) or FenceNotIssuedError (``fence`` above it: a token never
        issued, carrying the current one). A fenced append stamps ``metadata["fence"]`` on
        each event. A refused append changes nothing.
        """
        ...

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        """Events with ``from_sequence <= sequence <= to_sequence``, in order."""
        ...

    async def head(self, execution_id: str) -> int: ...

    async def list_executions(
        self, *, after: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> tuple[str, ...]:
        """Execution ids in ascending code-point order, strictly after ``after``: every id
        with a log, one whose events were all truncated included (until it is deleted)."""
        ...

    async def close(self) -> None: ...

    # -- optional: offered when named in ``capabilities``, else raise Unsupported ---------

    async def acquire_fence(self, execution_id: str) -> int:
        """Bump the execution's token and return it (a never-fenced execution has 0). An id
        with no log yet is fenced all the same (its token is kept for the append that
        creates the log), and is not listed by ``list_executions`` until it has events."""
        ...

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        """Bump only if the token equals ``fence`` and nothing answers past ``park_seq``."""
        ...

    async def append_if_unchanged(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        observed_fence: int,
    ) -> tuple[Event, ...]:
        """Append only if the token still equals ``observed_fence`` (StaleFenceError if
        not, above or below it); never presents or bumps a token, and stamps nothing. The
        token is checked before the sequence: it is the guard this call exists for. The
        checks and the write are one atomic step (an acquire in between must not be
        missed)."""
        ...

    async def append_many(
        self, requests: Sequence[AppendRequest]
    ) -> tuple[tuple[Event, ...], ...]:
        """Several executions' appends, all or nothing; refuses a repeated execution id.
        The requests are checked in the order given, each as an append (sequence, then
        token), and the first refused one's error is raised."""
        ...

    async def delete_execution(self, execution_id: str) -> bool:
        """Remove the log and move its token one past its current value, in one atomic
        step; True if a log existed (a delete that finds none changes nothing).

        Every holder of the token, the runner of the deleted log included, is stale
        afterwards, so it cannot write into a re-created log of the same id even when that
        log has reached the head it expects (docs/design.md, "Deleting a log fences out
        its writers")."""
        ...

    async def copy_prefix(self, source: str, target: str, *, through_sequence: int) -> int:
        """Copy ``source``'s events up to ``through_sequence`` into a new ``target``, at
        their own sequences; returns the number copied. The target's head is
        ``through_sequence + 1`` even when the source has truncated some or all of them.

        Refuses, changing nothing, in this order: a bad id or a negative
        ``through_sequence`` (InvalidExecutionIdError, InvalidSequenceError);
        ``source == target`` (InvalidInputError, before either log is looked at); a source
        with no log (ExecutionNotFoundError); ``through_sequence`` at or past the source's
        head (InvalidSequenceError); a target that has a log
        (ExecutionAlreadyExistsError). The target's token is left as it was (neither reset
        nor taken from the source); the check of the target and the copy are one atomic
        step."""
        ...

    async def truncate_prefix_keeping(self, execution_id: str, *, keep_from_sequence: int) -> int:
        """Drop events below ``keep_from_sequence`` (the head stays); returns the number
        dropped. ``keep_from_sequence`` may equal the head (everything is dropped); a
        negative one, or one past the head, is refused with InvalidSequenceError, and an
        execution with no log with ExecutionNotFoundError, changing nothing."""
        ...

    def subscribe(self, execution_id: str, *, from_sequence: int = 0) -> AsyncIterator[Event]:
        """Events from ``from_sequence`` on, then live ones as they are appended. Each is
        the caller's own copy. Closing the store ends a subscription that is waiting (its
        iteration stops, or its next item raises StoreClosedError)."""
        ...


# -- timers (see docs/design.md, "Timers and re-drives") -----------------------------------


@dataclass(frozen=True, slots=True)
class Redrive:
    """Marks a timer row as a re-drive of a contended resume; ``attempt`` counts from 0."""

    attempt: int


@dataclass(frozen=True, slots=True)
class TimerRecord:
    """A wake-up for ``execution_id`` at ``wake_at`` (UTC); idempotent per that pair."""

    execution_id: str
    wake_at: datetime
    redrive: Redrive | None = None


@runtime_checkable
class TimerStore(Protocol):
    """Durable wake-ups. ``schedule`` upserts: a later schedule never downgrades a re-drive
    row and a plain schedule never clears one (``redrive = COALESCE(new, old)``)."""

    async def schedule(self, record: TimerRecord) -> None: ...

    async def due(
        self, now: datetime, *, limit: int = DEFAULT_LIST_LIMIT, redrive: bool = True
    ) -> tuple[TimerRecord, ...]:
        """Rows with ``wake_at <= now`` ordered by (wake_at, execution_id). With
        ``redrive=False`` re-drive rows are excluded *before* the limit applies."""
        ...

    async def pending(self, execution_id: str) -> tuple[TimerRecord, ...]:
        """Every row of one execution, due or not, ordered by wake_at."""
        ...

    async def complete(self, execution_id: str, wake_at: datetime) -> bool:
        """Retire one fired row; False if it was not there."""
        ...

    async def cancel(self, execution_id: str, wake_at: datetime | None = None) -> int:
        """Remove one row, or every row of the execution; returns how many."""
        ...

    async def close(self) -> None: ...


# -- leases ------------------------------------------------------------------------------------

LeaseScope: TypeAlias = Literal["process", "host", "cluster", "unknown"]
"""Who can see a lease: one process (memory), one host (SQLite file), every node
(PostgreSQL). Lease evidence only holds among nodes that share the scope."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease as the store sees it; ``expires_at`` is on the store's own clock."""

    key: str
    holder: str
    acquired_at: datetime
    expires_at: datetime


@runtime_checkable
class LeaseStore(Protocol):
    """Time-bounded ownership with expiry decided by the store's clock."""

    @property
    def scope(self) -> LeaseScope: ...

    async def acquire(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        """Take the lease if free, expired, or already ours (which extends it); else
        LeaseHeldError."""
        ...

    async def renew(self, key: str, holder: str, *, ttl_seconds: float) -> Lease:
        """Extend our unexpired lease; LeaseNotHeldError otherwise."""
        ...

    async def release(self, key: str, holder: str) -> bool:
        """Give the lease up; False if we did not hold it."""
        ...

    async def inspect(self, key: str) -> Lease | None:
        """The current unexpired lease, or None."""
        ...

    async def close(self) -> None: ...
