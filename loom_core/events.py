"""The event model: what a writer hands in (:class:`NewEvent`) and what a store gives back
(:class:`Event`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeAlias

from loom_core.kinds import is_answering_kind

__all__ = ["Event", "JsonObject", "JsonValue", "NewEvent", "is_answering"]

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


def is_answering(event: Event | NewEvent) -> bool:
    """Whether ``event`` answers a park (see :func:`is_answering_kind`)."""
    return is_answering_kind(event.kind, event.metadata)
