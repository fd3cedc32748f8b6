"""What the runtime writes to an execution's log: one builder per kind, and the JSON rules.

Every payload is documented in docs/runtime.md, "The log"; :mod:`loom_runtime.fold` reads
them back. A *position* names a durable call: ``(k,)`` is the body's k-th call, and a
branch of ``ctx.gather`` at position ``p`` numbers its own calls ``p + (branch, k)``, so
positions never depend on the order in which concurrent calls finish.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, NamedTuple, TypeAlias

from loom_core import EventKind, JsonObject, JsonValue, NewEvent
from loom_core.errors import InvalidInputError
from loom_core.spi import MAX_INT_BITS, build_new_event
from loom_runtime.errors import NotJsonError, shown_safely

__all__ = [
    "ATTEMPT_FAILED_KIND",
    "INBOX_PREFIX",
    "MESSAGE_KIND",
    "Position",
    "Received",
    "Wait",
    "WaitCall",
    "attempt_failed",
    "cancelled",
    "completed",
    "consumed",
    "continued",
    "copied",
    "denied",
    "failed",
    "check_text",
    "inbox_of",
    "json_value",
    "message",
    "parse_position",
    "position_json",
    "position_text",
    "recovered",
    "resumed",
    "started",
    "step_completed",
    "step_failed",
    "suspended",
]

Position: TypeAlias = tuple[int, ...]
WaitCall: TypeAlias = Literal["sleep", "receive", "receive_any"]



class Received(NamedTuple):
    """What ``ctx.receive_any`` took: the message's ``topic`` and its ``value``."""

    topic: str
    value: JsonValue


INBOX_PREFIX: Final = "$inbox:"
"""Messages for execution ``x`` live in the reserved stream ``$inbox:x``."""

MESSAGE_KIND: Final = "MESSAGE"
"""The kind of an inbox event (an application kind: it never answers a park)."""

ATTEMPT_FAILED_KIND: Final = "STEP_ATTEMPT_FAILED"
"""The kind of a step's failed attempt that is to be tried again (a runtime kind, not the
kernel's: only a running driver writes it, never while the execution is parked)."""


SUCCESSOR_SUFFIX: Final = re.compile(r"#[0-9]+\Z")
"""The end of the ids continue-as-new gives: ``<first id>#<generation>``."""


def inbox_of(execution_id: str) -> str:
    return INBOX_PREFIX + execution_id


def execution_subject(execution_id: str, event: NewEvent) -> str:
    """A ``subject_of`` for the crypto decorator under the runtime: an execution, its
    inbox (``$inbox:<id>``) and every generation continue-as-new made of it
    (``<id>#<n>``) share one subject, the first execution's id, so
    ``shred_subject(storage, "order-42")`` erases all of them. A fork is an execution of
    its own, under its own subject. It reads the ids the runtime writes: with the tenant
    decorator, put ``tenant`` before ``crypto`` in ``decorators=[...]``."""
    if execution_id.startswith(INBOX_PREFIX):
        execution_id = execution_id[len(INBOX_PREFIX) :]
    found = SUCCESSOR_SUFFIX.search(execution_id)
    return execution_id if found is None else execution_id[: found.start()]


def position_text(position: Position) -> str:
    return ".".join(map(str, position))


def position_json(position: Position) -> list[JsonValue]:
    return [*position]


def json_value(value: object, where: str) -> JsonValue:
    """``value`` as the JSON it will be recorded as; refuse the rest with NotJsonError.

    What the kernel refuses in an event is refused here, before anything is run or written
    (a string holding U+0000 or a lone surrogate, an integer of more than
    ``MAX_INT_BITS`` bits, NaN and the infinities); tuples become lists, and a subclass of
    a JSON type (an ``IntEnum``, a ``str`` subclass) becomes its plain value. Live and
    replayed runs both see this normalised value, so a body cannot tell them apart.
    """
    return _json(value, where, 0)


def json_arguments(args: Sequence[object], where: str) -> list[JsonValue]:
    """A workflow's arguments as the JSON they will be recorded as, each checked as a
    value of its own: the list that holds them is the record's, not a level of theirs, so
    an argument may nest as deep as a step's result or a message."""
    return [_json(arg, where, 0) for arg in args]


_PLAIN: Final = frozenset({str, int, bool, type(None)})
_INT_BOUND: Final = 1 << MAX_INT_BITS


def fresh(value: JsonValue) -> JsonValue:
    """A copy of a JSON value sharing no list or dict with it. What a run hands its body
    is fresh: a body that changes an argument, a step's result or a message must not
    change what the runtime keeps (a result not yet written, the record a later replay in
    this process serves), or a replay here would differ from one after a restart."""
    kind = type(value)
    if kind is dict:
        return {
            k: v if type(v) in _PLAIN else fresh(v)
            for k, v in value.items()  # type: ignore[union-attr]  # a dict
        }
    if kind is list:
        return [v if type(v) in _PLAIN else fresh(v) for v in value]  # type: ignore[union-attr]
    return value


def _json(value: Any, where: str, depth: int) -> JsonValue:
    # The common shapes (a scalar, a dict of scalars) are taken inline; anything else, or
    # anything these cheap looks cannot vouch for (non-ASCII text, a huge integer, a
    # subclass), goes to the walk, which decides. (``value`` is Any: the looks are type
    # checks, and typing.cast would cost a call on every value.)
    kind = type(value)
    if kind is str:
        if value.isascii() and "\x00" not in value:
            return value  # type: ignore[no-any-return]
    elif kind is int:
        if -_INT_BOUND < value < _INT_BOUND:
            return value  # type: ignore[no-any-return]
    elif kind is bool or value is None:
        return value  # type: ignore[no-any-return]
    elif kind is dict and depth < 100:
        out: dict[str, JsonValue] = {}
        for k, v in value.items():
            if type(k) is not str or not k.isascii() or "\x00" in k:
                break
            item = type(v)
            if (
                item is bool
                or v is None
                or (item is str and v.isascii() and "\x00" not in v)
                or (item is int and -_INT_BOUND < v < _INT_BOUND)
            ):
                out[k] = v
            else:
                out[k] = _json(v, where, depth + 1)
        else:
            return out
    return _json_checked(value, where, depth)


def _json_checked(value: object, where: str, depth: int) -> JsonValue:
    if depth > 100:
        raise NotJsonError(where, "nested more than 100 levels deep")
    if value is None:
        return None
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise NotJsonError(
                where, f"an integer of more than {MAX_INT_BITS} bits (store it as a string)"
            )
        # The base class's own conversion: a subclass's __int__, __float__ or __str__
        # (an enum mixed with str names its member: "Status.PAID") is not its value.
        return int.__int__(value)
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJsonError(where, f"{value!r} has no JSON form")
        return float.__float__(value)
    if isinstance(value, list | tuple):
        return [_json_checked(v, where, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise NotJsonError(
                    where, f"dict key {shown_safely(k)} is a {type(k).__name__}, not a str"
                )
            out[_text(k, where)] = _json_checked(v, where, depth + 1)
        return out
    if inspect.isawaitable(value):
        # Nearly always a missing await (return ctx.step(...), a step returning the
        # coroutine of the function it meant to call): say so, not only what JSON is.
        raise NotJsonError(
            where,
            f"a {type(value).__name__} ({shown_safely(value):.60}), which nothing awaited: "
            "put await before it to pass what it returns",
        )
    raise NotJsonError(where, f"a {type(value).__name__} ({shown_safely(value):.60})")


def check_text(value: object, what: str) -> str:
    """A non-empty ``str`` the runtime records as it is (a topic, a message key): one a
    store can hold, else InvalidInputError naming ``what``."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} must be a non-empty str, not {value!r}")
    try:
        return _text(value, what)
    except NotJsonError:
        raise InvalidInputError(
            f"{what} {value[:40]!r} contains U+0000 or a lone surrogate, which no store "
            "can hold"
        ) from None


def _text(value: str, where: str) -> str:
    """``value`` as a plain str, refusing what no store can hold."""
    if "\x00" in value:
        raise NotJsonError(where, f"the string {value[:40]!r} contains U+0000")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise NotJsonError(where, f"the string {value[:40]!r} contains a lone surrogate") from None
    return str.__str__(value)


def parse_position(raw: JsonValue) -> Position:
    """A position read back from JSON; ValueError when ``raw`` is not one."""
    if type(raw) is list and len(raw) == 1 and type(raw[0]) is int and raw[0] >= 0:
        return (raw[0],)  # a call in the body itself, the common case
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in raw)
    ):
        raise ValueError(f"a position is a non-empty list of non-negative ints, not {raw!r}")
    return tuple(p for p in raw if isinstance(p, int))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class Wait:
    """One thing a park waits for: a timer (``sleep``), or a message on one of
    ``topics`` (``receive`` has one, ``receive_any`` several), with ``wake_at`` as its
    timeout when it has one."""

    position: Position
    call: WaitCall
    wake_at: datetime | None = None
    topics: tuple[str, ...] = ()
    site: str = ""

    def to_json(self) -> JsonObject:
        out: JsonObject = {"position": position_json(self.position), "call": self.call}
        if self.wake_at is not None:
            out["wake_at"] = _iso(self.wake_at)
        if self.call == "receive":
            out["topic"] = self.topics[0]
        elif self.call == "receive_any":
            out["topics"] = list(self.topics)
        if self.site:
            out["site"] = self.site
        return out

    @staticmethod
    def from_json(raw: Mapping[str, JsonValue]) -> Wait:
        """Read a wait back; ValueError when ``raw`` is not one."""
        position = parse_position(raw.get("position"))
        call = raw.get("call")
        raw_wake = raw.get("wake_at")
        wake_at = datetime.fromisoformat(raw_wake) if isinstance(raw_wake, str) else None
        site = raw.get("site")
        site = site if isinstance(site, str) else ""
        if call == "sleep":
            return Wait(position, "sleep", wake_at, (), site)
        if call == "receive":
            topic = raw.get("topic")
            if not isinstance(topic, str):
                raise ValueError(f"a receive's wait names its topic, not {topic!r}")
            return Wait(position, "receive", wake_at, (topic,), site)
        if call == "receive_any":
            topics = raw.get("topics")
            if (
                not isinstance(topics, list)
                or not topics
                or not all(isinstance(t, str) for t in topics)
            ):
                raise ValueError(f"a receive_any's wait lists its topics, not {topics!r}")
            return Wait(position, "receive_any", wake_at, tuple(str(t) for t in topics), site)
        raise ValueError(f"a wait's call is 'sleep', 'receive' or 'receive_any', not {call!r}")


def started(
    workflow: str,
    args: Sequence[JsonValue],
    *,
    fingerprint: str,
    node: str,
    root: str,
    generation: int = 0,
    continued_from: str | None = None,
    parent: JsonValue = None,
    deadline: datetime | None = None,
    forked_from: tuple[str, int] | None = None,
    fork_asked: int | None = None,
) -> NewEvent:
    """The first event of every execution. ``parent`` is the edge a child execution will
    carry (``None`` for a top-level one); ``deadline``, when the execution has one, the
    instant it is cancelled at if it has not ended (absent from the payload otherwise);
    ``forked_from``, for a fork, the execution it was forked from and how many of the
    body's calls it copied (absent otherwise), and ``fork_asked`` the ``at`` its call
    passed when that was past the calls recorded then (kept as ``asked``, so that a
    retried call, made once the original has recorded more, finds the fork it made)."""
    payload: dict[str, JsonValue] = {
        "workflow": workflow,
        "input": list(args),
        "fingerprint": fingerprint,
        "node": node,
        "root": root,
        "generation": generation,
        "continued_from": continued_from,
        "parent": parent,
    }
    if deadline is not None:
        payload["deadline"] = _iso(deadline)
    if forked_from is not None:
        edge: dict[str, JsonValue] = {"execution": forked_from[0], "at": forked_from[1]}
        if fork_asked is not None:
            edge["asked"] = fork_asked
        payload["forked_from"] = edge
    return build_new_event(EventKind.EXECUTION_STARTED, payload, {})


def step_completed(
    position: Position,
    call: str,
    name: str,
    value: JsonValue,
    attempt: int,
    site: str,
    topics: tuple[str, ...] = (),
) -> NewEvent:
    """A recorded result: a step's (``call="step"``), or a value the body asked for
    (``now``, ``random``, ``uuid``) or a ``patch`` marker; in a fork, any call's, with
    a ``receive_any``'s ``topics``."""
    payload: JsonObject = {
        "position": position_json(position),
        "call": call,
        "name": name,
        "result": value,
        "attempt": attempt,
        "site": site,
    }
    if topics:
        payload["topics"] = list(topics)
    return build_new_event(EventKind.STEP_COMPLETED, payload, {})


def copied(
    position: Position,
    call: str,
    name: str,
    value: JsonValue,
    error: tuple[str, str] | None,
    attempt: int,
    site: str,
    topics: tuple[str, ...] = (),
) -> NewEvent:
    """A durable call's record copied into a fork: a STEP_FAILED for a failed step, else
    a STEP_COMPLETED, whatever the call was (a sleep, a receive, a ``receive_any`` with
    its ``topics`` too), so the fork's body is served it as the original's was."""
    if error is not None:
        return step_failed(position, name, error[0], error[1], attempt, site)
    return step_completed(position, call, name, value, attempt, site, topics)


def step_failed(
    position: Position, name: str, error_type: str, message_: str, attempt: int, site: str
) -> NewEvent:
    return build_new_event(
        EventKind.STEP_FAILED,
        {
            "position": position_json(position),
            "call": "step",
            "name": name,
            "error": {"type": error_type, "message": message_},
            "attempt": attempt,
            "site": site,
        },
        {},
    )


def attempt_failed(
    position: Position,
    name: str,
    error_type: str,
    message_: str,
    attempt: int,
    retry_at: datetime,
    site: str,
) -> NewEvent:
    """A failed attempt of a step that its retry policy tries again at ``retry_at``."""
    return build_new_event(
        ATTEMPT_FAILED_KIND,
        {
            "position": position_json(position),
            "call": "step",
            "name": name,
            "error": {"type": error_type, "message": message_},
            "attempt": attempt,
            "retry_at": _iso(retry_at),
            "site": site,
        },
        {},
    )


def suspended(waits: Sequence[Wait]) -> NewEvent:
    return build_new_event(
        EventKind.EXECUTION_SUSPENDED, {"waits": [w.to_json() for w in waits]}, {}
    )


def resumed(
    park_seq: int, position: Position, answer: JsonObject, node: str, fingerprint: str
) -> NewEvent:
    """The answer to the park at ``park_seq``: ``answer["kind"]`` is ``timer``, ``timeout``
    or ``message`` (with its inbox ``message`` sequence). ``fingerprint`` is the code's
    that answers, and runs on from the answer."""
    return build_new_event(
        EventKind.EXECUTION_RESUMED,
        {
            "park": park_seq,
            "position": position_json(position),
            "answer": answer,
            "node": node,
            "fingerprint": fingerprint,
        },
        {},
    )


def consumed(
    position: Position,
    topic: str,
    message_seq: int,
    value: JsonValue,
    any_of: tuple[str, ...] = (),
) -> NewEvent:
    """A message taken by the receive at ``position``; ``any_of`` is the topics of a
    ``receive_any`` (empty for a ``receive``, whose topic is ``topic``)."""
    payload: JsonObject = {
        "position": position_json(position),
        "topic": topic,
        "message": message_seq,
        "value": value,
    }
    if any_of:
        payload["call"] = "receive_any"
        payload["topics"] = list(any_of)
    return build_new_event(EventKind.MESSAGE_CONSUMED, payload, {})


def completed(result: JsonValue) -> NewEvent:
    return build_new_event(EventKind.EXECUTION_COMPLETED, {"result": result}, {})


def failed(error_type: str, message_: str) -> NewEvent:
    return build_new_event(
        EventKind.EXECUTION_FAILED, {"error": {"type": error_type, "message": message_}}
    , {})


def cancelled(reason: str | None, node: str, *, timed_out: bool = False) -> NewEvent:
    """``timed_out``: the execution's deadline passed (the payload says so only then)."""
    payload: dict[str, JsonValue] = {"reason": reason, "node": node}
    if timed_out:
        payload["timed_out"] = True
    return build_new_event(EventKind.EXECUTION_CANCELLED, payload, {})


def continued(successor: str, args: Sequence[JsonValue]) -> NewEvent:
    return build_new_event(
        EventKind.EXECUTION_CONTINUED, {"successor": successor, "input": list(args)}, {}
    )


def recovered(node: str, fence: int, fingerprint: str, *, carried_on: bool = False) -> NewEvent:
    """A takeover by ``node`` under ``fence``, with the ``fingerprint`` of the body's code
    that is to run (recoveries in a row count only while the code stays the same).
    ``carried_on``: a live process took its own run back (after a store failure or a
    cancelled call), not a node recovering after its process died."""
    payload: dict[str, JsonValue] = {"node": node, "fence": fence, "fingerprint": fingerprint}
    if carried_on:
        payload["carried_on"] = True
    return build_new_event(EventKind.EXECUTION_RECOVERED, payload, {})


def denied(action: str, principal: JsonValue) -> NewEvent:
    return build_new_event(
        EventKind.EXECUTION_DENIED, {"action": action, "principal": principal}, {}
    )


def message(
    topic: str, value: JsonValue, key: str | None, wake_at: datetime | None = None
) -> NewEvent:
    """A message; ``wake_at`` is the instant of the wake row its sender wrote first."""
    payload: dict[str, JsonValue] = {"topic": topic, "value": value, "key": key}
    if wake_at is not None:
        payload["wake_at"] = _iso(wake_at)
    return build_new_event(MESSAGE_KIND, payload, {})
