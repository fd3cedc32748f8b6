"""The event model: what a writer hands in (:class:`NewEvent`) and what a store gives back
(:class:`Event`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeAlias

from loom_core.kinds import is_answering_kind

__all__ = [
    "Event",
    "JsonObject",
    "JsonValue",
    "NewEvent",
    "build_event",
    "build_new_event",
    "is_answering",
]

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. ``payload`` is any JSON value, ``metadata`` a JSON object.

    The store validates both on append (:class:`~loom_core.errors.InvalidEventError`) and
    refuses the reserved metadata key ``fence``: the store stamps it from ``append(fence=…)``.
    """

    kind: str
    payload: JsonValue = None
    metadata: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    """An event as recorded: gapless 0-based ``sequence`` per execution, store-clock time."""

    execution_id: str
    sequence: int
    kind: str
    payload: JsonValue
    metadata: JsonObject
    recorded_at: datetime

    @property
    def fence(self) -> int:
        """The token this event was written under; 0 for an unfenced append."""
        value = self.metadata.get("fence")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(slots=True)
class _UnfrozenNewEvent:
    """:class:`NewEvent`'s fields in its order, without the frozen ``__setattr__``."""

    kind: str
    payload: JsonValue
    metadata: Mapping[str, JsonValue]


def build_new_event(
    kind: str, payload: JsonValue, metadata: Mapping[str, JsonValue]
) -> NewEvent:
    """``NewEvent(kind, payload, metadata)``, the same frozen event, at about half the
    cost (see :func:`build_event`). For code that builds one per event it writes (a
    decorator handing events to the store below, a runtime recording a step); like the
    constructor it checks nothing: the store checks what it is given."""
    event = _UnfrozenNewEvent(kind, payload, metadata)
    event.__class__ = NewEvent  # type: ignore[assignment]
    return event  # type: ignore[return-value]


@dataclass(slots=True)
class _UnfrozenEvent:
    """:class:`Event`'s fields in its order, without the frozen ``__setattr__``: built by
    plain slot stores, then made an ``Event`` (same slots, same layout)."""

    execution_id: str
    sequence: int
    kind: str
    payload: JsonValue
    metadata: JsonObject
    recorded_at: datetime


def build_event(
    execution_id: str,
    sequence: int,
    kind: str,
    payload: JsonValue,
    metadata: JsonObject,
    recorded_at: datetime,
) -> Event:
    """``Event(execution_id, sequence, kind, payload, metadata, recorded_at)``, the same
    frozen event, at about a third of the cost.

    A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__`` by
    name; this builds the fields by plain slot stores and then gives the object
    :class:`Event`'s class (the layouts are the same). For stores and decorators, which
    build one per event they return. Like ``Event(...)``, it checks nothing.
    """
    event = _UnfrozenEvent(execution_id, sequence, kind, payload, metadata, recorded_at)
    event.__class__ = Event  # type: ignore[assignment]
    return event  # type: ignore[return-value]


def is_answering(event: Event | NewEvent) -> bool:
    """Whether ``event`` answers a park (see :func:`is_answering_kind`)."""
    return is_answering_kind(event.kind, event.metadata)
