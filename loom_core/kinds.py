"""Kernel event kinds and their answering/ignorable classification (see
docs/design.md, "Answering and ignorable events").

A conditional fence (``acquire_fence_if``) is stale when an *answering* event exists past
the park it answers. Which kinds answer is a total mapping over :class:`EventKind`, checked
when this module is imported: adding a kernel kind without classifying it fails the import,
so the decision cannot be forgotten.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal

from loom_core.errors import LoomError

__all__ = [
    "ANSWERING_KINDS",
    "CLASSIFICATION",
    "Classification",
    "EventKind",
    "KERNEL_KINDS",
    "UnclassifiedKindError",
    "is_answering_kind",
]

Classification = Literal["answering", "ignorable"]


class EventKind(enum.StrEnum):
    """Every kind the kernel itself writes. Any other kind is an application event."""

    EXECUTION_STARTED = "EXECUTION_STARTED"
    EXECUTION_SUSPENDED = "EXECUTION_SUSPENDED"
    EXECUTION_RESUMED = "EXECUTION_RESUMED"
    EXECUTION_COMPLETED = "EXECUTION_COMPLETED"
    EXECUTION_FAILED = "EXECUTION_FAILED"
    EXECUTION_CANCELLED = "EXECUTION_CANCELLED"
    EXECUTION_CONTINUED = "EXECUTION_CONTINUED"
    EXECUTION_DENIED = "EXECUTION_DENIED"
    EXECUTION_MIGRATED = "EXECUTION_MIGRATED"
    EXECUTION_RECOVERED = "EXECUTION_RECOVERED"
    STEP_COMPLETED = "STEP_COMPLETED"
    STEP_FAILED = "STEP_FAILED"
    OUTCOME_RECORDED = "OUTCOME_RECORDED"
    MESSAGE_CONSUMED = "MESSAGE_CONSUMED"
    ERASURE_PENDING = "ERASURE_PENDING"
    PAYLOAD_SHREDDED = "PAYLOAD_SHREDDED"
    ANNOTATION = "ANNOTATION"


class UnclassifiedKindError(LoomError, TypeError):
    """A kernel kind with no answering/ignorable decision (raised at import)."""


# No default on purpose: a new kind must be placed in one of these two lists.
_ANSWERING: Final = (
    EventKind.EXECUTION_RESUMED,
    EventKind.EXECUTION_SUSPENDED,
    EventKind.EXECUTION_COMPLETED,
    EventKind.EXECUTION_FAILED,
    EventKind.EXECUTION_CANCELLED,
    EventKind.EXECUTION_CONTINUED,
)
_IGNORABLE: Final = (
    EventKind.EXECUTION_STARTED,
    EventKind.EXECUTION_DENIED,
    EventKind.EXECUTION_MIGRATED,
    EventKind.EXECUTION_RECOVERED,
    EventKind.STEP_COMPLETED,
    EventKind.STEP_FAILED,
    EventKind.OUTCOME_RECORDED,
    EventKind.MESSAGE_CONSUMED,
    EventKind.ERASURE_PENDING,
    EventKind.PAYLOAD_SHREDDED,
    EventKind.ANNOTATION,
)


def build_classification(
    kinds: type[enum.StrEnum],
    answering: tuple[str, ...],
    ignorable: tuple[str, ...],
) -> Mapping[str, Classification]:
    """Return the total classification of ``kinds``; refuse a gap or a double entry."""
    both = set(answering) & set(ignorable)
    if both:
        raise UnclassifiedKindError(f"kinds classified twice: {sorted(both)}")
    table: dict[str, Classification] = {k: "answering" for k in answering}
    table.update({k: "ignorable" for k in ignorable})
    missing = [k.value for k in kinds if k.value not in table]
    if missing:
        raise UnclassifiedKindError(
            f"kernel kinds without an answering/ignorable classification: {missing}; "
            "add each to _ANSWERING or _IGNORABLE in loom_core/kinds.py (see "
            "docs/design.md, 'Answering and ignorable events')"
        )
    unknown = sorted(set(table) - {k.value for k in kinds})
    if unknown:
        raise UnclassifiedKindError(f"classified kinds that are not kernel kinds: {unknown}")
    return MappingProxyType(table)


CLASSIFICATION: Final[Mapping[str, Classification]] = build_classification(
    EventKind, _ANSWERING, _IGNORABLE
)
KERNEL_KINDS: Final[frozenset[str]] = frozenset(CLASSIFICATION)
ANSWERING_KINDS: Final[frozenset[str]] = frozenset(
    k for k, c in CLASSIFICATION.items() if c == "answering"
)


def is_answering_kind(kind: str, metadata: Mapping[str, object]) -> bool:
    """Whether an event of ``kind`` with ``metadata`` answers a park (see
    docs/design.md, "Answering and ignorable events").

    1. a kernel kind is classified by :data:`CLASSIFICATION`;
    2. any other kind is an application event and is ignorable,
    3. unless its metadata carries ``kernel`` equal to JSON ``true`` (a kernel kind written
       by a newer node): then it answers, fail-closed. The string ``"true"`` does not count.
    """
    classified = CLASSIFICATION.get(kind)
    if classified is not None:
        return classified == "answering"
    return metadata.get("kernel") is True
