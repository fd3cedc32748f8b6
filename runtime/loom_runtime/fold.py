"""One pure function from a log to what it means: :func:`fold`.

The runtime (replay, resume, recovery), the timer service, the handle and the ``loom``
command all read an execution through this function and nothing else, so they can never
disagree about its state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal, TypeAlias

from loom_core import Event, EventKind, JsonObject, JsonValue
from loom_core.spi import KERNEL_KINDS
from loom_runtime.errors import LogFormatError
from loom_runtime.records import ATTEMPT_FAILED_KIND, Position, Wait, parse_position

__all__ = [
    "Park", "Recorded", "Status", "TERMINAL", "View", "advance", "completion_result",
    "describe_any", "fold",
]

Status: TypeAlias = Literal[
    "running", "suspended", "completed", "failed", "cancelled", "continued"
]
TERMINAL: frozenset[Status] = frozenset({"completed", "failed", "cancelled", "continued"})


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the log holds for one durable call."""

    position: Position
    call: str
    name: str
    value: JsonValue = None
    error: tuple[str, str] | None = None
    attempt: int = 1
    site: str = ""
    sequence: int = 0
    topics: tuple[str, ...] = ()
    """A ``receive_any``'s topics; its ``name`` is the topic it took ("" on timeout)."""
    retry_at: datetime | None = None
    """For a step's failed attempt that is to be tried again (in ``View.retries``): when."""

    def describe(self) -> str:
        if self.retry_at is not None:
            return f"step {self.name!r} (attempt {self.attempt} failed, to be tried again)" + (
                f" at {self.site}" if self.site else ""
            )
        what = {
            "step": f"step {self.name!r}",
            "patch": f"patched({self.name!r})",
            "receive": f"receive({self.name!r})",
            "receive_any": describe_any(self.topics),
            "event": f"set_event({self.name!r})",
        }.get(self.call, f"{self.call}()")
        return what + (f" at {self.site}" if self.site else "")


def describe_any(topics: tuple[str, ...]) -> str:
    """How a divergence names a ``receive_any`` call."""
    return "receive_any(" + ", ".join(repr(t) for t in topics) + ")"


@dataclass(frozen=True, slots=True)
class Park:
    """The newest park while it is unanswered."""

    sequence: int
    fence: int
    waits: tuple[Wait, ...]


@dataclass(slots=True)
class View:
    """An execution as its log says it is. ``status`` is None when there is no log."""

    execution_id: str
    head: int = 0
    status: Status | None = None
    workflow: str = ""
    input: list[JsonValue] = field(default_factory=list)
    fingerprint: str = ""
    node: str = ""
    root: str = ""
    generation: int = 0
    continued_from: str | None = None
    parent: JsonValue = None
    fence: int = 0
    records: dict[Position, Recorded] = field(default_factory=dict)
    waits: dict[Position, Wait] = field(default_factory=dict)
    park: Park | None = None
    consumed: set[int] = field(default_factory=set)
    result: JsonValue = None
    error: tuple[str, str] | None = None
    cancel_reason: str | None = None
    successor: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    deadline: datetime | None = None
    timed_out: bool = False
    forked_from: str | None = None
    """For a fork, the execution it was forked from."""
    forked_at: int | None = None
    """For a fork, how many of the body's calls it took from the one it was forked from."""
    recoveries: int = 0
    """How many takeovers (EXECUTION_RECOVERED) by the same code the log ends with, with
    nothing else the runtime acts on written after the first of them: the recoveries in
    a row whose runs died before they wrote anything."""
    recovered_by: str = ""
    """The fingerprint of the code those takeovers ran."""
    driven_by: str = ""
    """The fingerprint of the code that drove the execution last: the code that started
    it, took it over, or answered its latest park (and ran on from the answer). Code with
    this fingerprint replays the log as it was written."""
    carried_on: int = 0
    """How many takeovers by a live process carrying on its own run (EXECUTION_RECOVERED
    with ``carried_on``: after a store failure or a cancelled call) the log ends with: the
    carry-ons in a row whose runs wrote nothing before they stopped again."""
    retries: dict[Position, Recorded] = field(default_factory=dict)
    """The last failed attempt of each step that is being retried: a step that has
    neither completed nor failed for good."""
    parked_last: int = 0
    """The sequence of the newest park, answered or not (0 before the first): a call
    recorded before it was made by a run that went on until every branch of its body
    waited or ended."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def pending_waits(self) -> tuple[Wait, ...]:
        """The waits of the open park that no answer has reached."""
        if self.park is None:
            return ()
        return tuple(w for w in self.park.waits if w.position not in self.records)


def fold(events: Iterable[Event], into: View | None = None, *, execution_id: str = "") -> View:
    """Fold ``events`` (in sequence order) onto ``into`` (a copy; ``into`` is not changed)."""
    return advance(_copy(into) if into is not None else View(execution_id), events)


def advance(view: View, events: Iterable[Event]) -> View:
    """Fold ``events`` (in sequence order) onto ``view`` itself, for the one owner of a
    view that no one else holds (a run's own, at its end); returns it."""
    for event in events:
        if not view.execution_id:
            view.execution_id = event.execution_id
        apply = _APPLY.get(event.kind)
        if apply is None and _newer_kernel_kind(event):
            raise LogFormatError(
                view.execution_id, event.sequence, event.kind,
                "a kernel kind this loom-runtime does not know (its metadata says "
                '"kernel": true): a newer loom-runtime wrote it',
                remedy="upgrade loom-runtime on this node to the version that wrote it; "
                "until then this node does not drive the execution, and writes nothing to it",
            )
        if apply is not None:
            if (view.recoveries or view.carried_on) and apply is not _recovered:
                view.recoveries = view.carried_on = 0  # the run got as far as a write
            try:
                apply(view, event)
            except (ValueError, TypeError, KeyError) as exc:
                raise LogFormatError(
                    view.execution_id, event.sequence, event.kind, str(exc)
                ) from exc
        view.head = event.sequence + 1
        fence = event.metadata.get("fence")
        if type(fence) is int and fence > view.fence:
            view.fence = fence
    return view


def _newer_kernel_kind(event: Event) -> bool:
    """Whether ``event`` is of a kind a newer version of Loom wrote as its own (stamped
    ``"kernel": true``, docs/design.md): what it means for the execution is unknown here,
    so folding past it would misread the log. Any other unknown kind is an application
    event, which changes nothing the runtime acts on."""
    return event.kind not in KERNEL_KINDS and event.metadata.get("kernel") is True


def _copy(view: View) -> View:
    """A copy of ``view`` that folding can change without changing ``view``.

    Only the containers folding adds to are copied; what they hold (frozen records, waits
    and parks, JSON values read from the log) is shared, as nothing in the runtime changes
    it. A deep copy cost more than the rest of a short workflow's run.
    """
    copy = object.__new__(View)
    copy.execution_id = view.execution_id
    copy.head = view.head
    copy.status = view.status
    copy.workflow = view.workflow
    copy.input = list(view.input)
    copy.fingerprint = view.fingerprint
    copy.node = view.node
    copy.root = view.root
    copy.generation = view.generation
    copy.continued_from = view.continued_from
    copy.parent = view.parent
    copy.fence = view.fence
    copy.records = dict(view.records)
    copy.waits = dict(view.waits)
    copy.park = view.park
    copy.parked_last = view.parked_last
    copy.consumed = set(view.consumed)
    copy.result = view.result
    copy.error = view.error
    copy.cancel_reason = view.cancel_reason
    copy.successor = view.successor
    copy.started_at = view.started_at
    copy.finished_at = view.finished_at
    copy.deadline = view.deadline
    copy.timed_out = view.timed_out
    copy.forked_from = view.forked_from
    copy.forked_at = view.forked_at
    copy.recoveries = view.recoveries
    copy.recovered_by = view.recovered_by
    copy.driven_by = view.driven_by
    copy.carried_on = view.carried_on
    copy.retries = dict(view.retries) if view.retries else {}
    return copy


def _obj(payload: JsonValue) -> Mapping[str, JsonValue]:
    if not isinstance(payload, dict):
        raise TypeError(f"payload must be a JSON object, not {type(payload).__name__}")
    return payload


def _str(raw: Mapping[str, JsonValue], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise TypeError(f"{key!r} must be a str, not {value!r}")
    return value


def _opt_str(raw: Mapping[str, JsonValue], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) else None


def _int(raw: Mapping[str, JsonValue], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{key!r} must be an int, not {value!r}")
    return value


def _error(raw: JsonValue) -> tuple[str, str]:
    err = _obj(raw)
    return _str(err, "type"), _str(err, "message")


def _started(view: View, event: Event) -> None:
    p = _obj(event.payload)
    view.status = "running"
    view.workflow = _str(p, "workflow")
    raw_input = p.get("input")
    view.input = list(raw_input) if isinstance(raw_input, list) else []
    view.fingerprint = view.driven_by = _opt_str(p, "fingerprint") or ""
    view.node = _opt_str(p, "node") or ""
    view.root = _opt_str(p, "root") or event.execution_id
    view.generation = _int(p, "generation", 0)
    view.continued_from = _opt_str(p, "continued_from")
    view.parent = p.get("parent")
    view.started_at = event.recorded_at
    deadline = p.get("deadline")
    if deadline is not None:
        if not isinstance(deadline, str):
            raise TypeError(f"'deadline' must be an ISO 8601 str, not {deadline!r}")
        view.deadline = datetime.fromisoformat(deadline)
    fork = p.get("forked_from")
    if fork is not None:
        edge = _obj(fork)
        view.forked_from = _str(edge, "execution")
        view.forked_at = _int(edge, "at")


def _step(view: View, event: Event) -> None:
    p = _obj(event.payload)
    position = parse_position(p.get("position"))
    error = _error(p.get("error")) if event.kind == EventKind.STEP_FAILED else None
    if view.retries:
        view.retries.pop(position, None)
    raw_topics = p.get("topics")  # a receive_any's, copied into a fork
    view.records[position] = Recorded(
        position=position,
        call=_str(p, "call"),
        name=_opt_str(p, "name") or "",
        value=p.get("result"),
        error=error,
        attempt=_int(p, "attempt", 1),
        site=_opt_str(p, "site") or "",
        sequence=event.sequence,
        topics=_topics(raw_topics) if raw_topics is not None else (),
    )


def _topics(raw: JsonValue) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
        raise TypeError(f"'topics' must be a list of str, not {raw!r}")
    return tuple(t for t in raw if isinstance(t, str))


def _consumed(view: View, event: Event) -> None:
    p = _obj(event.payload)
    position = parse_position(p.get("position"))
    view.consumed.add(_int(p, "message"))
    wait = view.waits.get(position)
    raw_topics = p.get("topics")
    view.records[position] = Recorded(
        position=position,
        call="receive_any" if p.get("call") == "receive_any" else "receive",
        name=_str(p, "topic"),
        value=p.get("value"),
        site=wait.site if wait is not None else "",
        sequence=event.sequence,
        topics=tuple(t for t in raw_topics if isinstance(t, str))
        if isinstance(raw_topics, list)
        else (),
    )


def _suspended(view: View, event: Event) -> None:
    raw_waits = _obj(event.payload).get("waits")
    if not isinstance(raw_waits, list):
        raise TypeError("'waits' must be a list")
    waits = tuple(Wait.from_json(_obj(w)) for w in raw_waits)
    for wait in waits:
        view.waits[wait.position] = wait
    view.park = Park(event.sequence, event.fence, waits)
    view.parked_last = event.sequence
    view.status = "suspended"


def _resumed(view: View, event: Event) -> None:
    p = _obj(event.payload)
    # An answer written before answers recorded the answering code's fingerprint leaves
    # the execution's last driver as it was.
    view.driven_by = _opt_str(p, "fingerprint") or view.driven_by
    position = parse_position(p.get("position"))
    answer = _obj(p.get("answer"))
    wait = view.waits.get(position)
    if _str(answer, "kind") != "message":
        # A message's record is its MESSAGE_CONSUMED, appended in the same write.
        view.records[position] = Recorded(
            position=position,
            call=wait.call if wait is not None else "sleep",
            name=wait.topics[0] if wait is not None and wait.call == "receive" else "",
            value=None,
            site=wait.site if wait is not None else "",
            sequence=event.sequence,
            topics=wait.topics if wait is not None and wait.call == "receive_any" else (),
        )
    view.park = None
    view.status = "running"
    view.node = _opt_str(p, "node") or view.node


def _recovered(view: View, event: Event) -> None:
    p = _obj(event.payload)
    view.node = _opt_str(p, "node") or view.node
    fingerprint = _opt_str(p, "fingerprint") or ""
    view.driven_by = fingerprint
    if p.get("carried_on") is True:
        # A live process took its own run back: not a death, so it ends a count of
        # recoveries in a row, and starts one of carry-ons.
        view.recoveries = 0
        view.carried_on += 1
        return
    view.carried_on = 0
    if view.recoveries and fingerprint == view.recovered_by:
        view.recoveries += 1
    else:  # the first in a row, or one by other code: a deploy starts the count again
        view.recoveries = 1
        view.recovered_by = fingerprint


def completion_result(event: Event) -> JsonValue:
    """The result an EXECUTION_COMPLETED event records: what folding it gives a view's
    ``result``, without building a view (a handle's wait ends on this event)."""
    try:
        return _obj(event.payload).get("result")
    except TypeError as exc:
        raise LogFormatError(event.execution_id, event.sequence, event.kind, str(exc)) from exc


def _completed(view: View, event: Event) -> None:
    view.result = completion_result(event)
    _finish(view, "completed", event)


def _failed(view: View, event: Event) -> None:
    view.error = _error(_obj(event.payload).get("error"))
    _finish(view, "failed", event)


def _cancelled(view: View, event: Event) -> None:
    p = _obj(event.payload)
    view.cancel_reason = _opt_str(p, "reason")
    view.timed_out = p.get("timed_out") is True
    _finish(view, "cancelled", event)


def _continued(view: View, event: Event) -> None:
    view.successor = _str(_obj(event.payload), "successor")
    _finish(view, "continued", event)


def _attempt_failed(view: View, event: Event) -> None:
    p = _obj(event.payload)
    position = parse_position(p.get("position"))
    retry_at = p.get("retry_at")
    if not isinstance(retry_at, str):
        raise TypeError(f"'retry_at' must be an ISO 8601 str, not {retry_at!r}")
    view.retries[position] = Recorded(
        position=position,
        call="step",
        name=_str(p, "name"),
        error=_error(p.get("error")),
        attempt=_int(p, "attempt"),
        site=_opt_str(p, "site") or "",
        sequence=event.sequence,
        retry_at=datetime.fromisoformat(retry_at),
    )


_APPLY: Final[Mapping[str, Callable[[View, Event], None]]] = {
    EventKind.EXECUTION_STARTED: _started,
    ATTEMPT_FAILED_KIND: _attempt_failed,
    EventKind.STEP_COMPLETED: _step,
    EventKind.STEP_FAILED: _step,
    EventKind.MESSAGE_CONSUMED: _consumed,
    EventKind.EXECUTION_SUSPENDED: _suspended,
    EventKind.EXECUTION_RESUMED: _resumed,
    EventKind.EXECUTION_RECOVERED: _recovered,
    EventKind.EXECUTION_COMPLETED: _completed,
    EventKind.EXECUTION_FAILED: _failed,
    EventKind.EXECUTION_CANCELLED: _cancelled,
    EventKind.EXECUTION_CONTINUED: _continued,
}
"""What each kind does to a view. Every other kind (EXECUTION_DENIED, annotations,
application events) changes nothing the runtime acts on, except an unknown one stamped
``"kernel": true``, which folding refuses (:func:`_newer_kernel_kind`)."""


def _finish(view: View, status: Status, event: Event) -> None:
    view.status = status
    view.park = None
    view.finished_at = event.recorded_at


def answer_of(kind: str, **extra: JsonValue) -> JsonObject:
    out: JsonObject = {"kind": kind}
    out.update(extra)
    return out
