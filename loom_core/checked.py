"""A batch of events the kernel has validated: :class:`CheckedEvents`.

``check_batch`` (in :mod:`loom_core.spi`) turns what a writer hands in into a
``CheckedEvents``, and takes one it is given back as already checked, in O(1). So a batch
checked at the top of a decorator stack is not checked again by each layer below it, and
a store can keep the encoded form the check produced instead of encoding again.

Nothing outside the kernel can make one that passes for checked: the class refuses to be
instantiated, and an instance that did not come from the kernel (built around
``__init__``, copied or unpickled) lacks the kernel's private seal and is validated like
any other sequence. Nor can a holder change one after the check: it keeps each event as
the JSON bytes the check produced, and every item it hands out is a fresh decoded copy.

This module's name is private; the class is public in :mod:`loom_core.spi` and
:mod:`loom_core.decorating`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Final, NoReturn, final, overload

import orjson

from loom_core.events import JsonObject, JsonValue, NewEvent, build_new_event

__all__ = ["CheckedEvents", "Encoded", "decode"]

Encoded = bytes | str
"""A checked JSON value as the kernel keeps it: ``bytes`` written by orjson (the common
case), or ``str`` written by :mod:`json` for a value orjson cannot write (an integer
beyond 64 bits), each decoded by the library that wrote it."""

_State = tuple[object, tuple[str, ...], tuple[Encoded, ...], tuple[Encoded, ...], tuple[bool, ...]]

_SEAL: Final = object()
"""What marks a batch the kernel built. Only the kernel's own modules read it."""


def decode(encoded: Encoded) -> JsonValue:
    """A fresh copy of a value the kernel checked and encoded."""
    if type(encoded) is bytes:
        value: JsonValue = orjson.loads(encoded)
        return value
    return json.loads(encoded)  # type: ignore[no-any-return]


@final
class CheckedEvents(Sequence[NewEvent]):
    """An immutable batch of validated events; only the kernel builds one.

    Pass it wherever a ``Sequence[NewEvent]`` goes: every kernel check and every store
    takes it as already checked. Each item is a fresh :class:`NewEvent` decoded from what
    the check kept, so changing an item's payload changes only that copy, never the
    batch. A decorator that makes new events from a checked batch builds them with
    :meth:`with_payloads` or :meth:`with_metadata`, which check only what is new.
    """

    __slots__ = ("_state",)

    _state: _State
    """(seal, kinds, payloads, metadata, answering): one tuple per field, event by event.
    One slot, so that building a batch costs one assignment."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            "CheckedEvents cannot be built directly; check_batch(events) returns one "
            "(loom_core.spi)"
        )

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("CheckedEvents is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("CheckedEvents is immutable")

    def __len__(self) -> int:
        return len(self._state[1])

    @overload
    def __getitem__(self, index: int) -> NewEvent: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[NewEvent, ...]: ...

    def __getitem__(self, index: int | slice) -> NewEvent | tuple[NewEvent, ...]:
        count = len(self._state[1])
        if isinstance(index, slice):
            return tuple(self._event(i) for i in range(count)[index])
        return self._event(range(count)[index])

    def __iter__(self) -> Iterator[NewEvent]:
        kinds = self._state[1]
        if len(kinds) == 1:
            # A one-event batch (most appends), without the generator.
            return iter((self._event(0),))
        return (self._event(i) for i in range(len(kinds)))

    def __repr__(self) -> str:
        return f"CheckedEvents({list(self)!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a CheckedEvents is not copied or pickled; pass the events themselves "
            "(tuple(batch)) and check them again where they arrive"
        )

    def _event(self, i: int) -> NewEvent:
        _, kinds, payloads, metadata, _ = self._state
        return build_new_event(kinds[i], decode(payloads[i]), _object(decode(metadata[i])))

    def payloads(self) -> tuple[JsonValue, ...]:
        """A fresh copy of each event's payload, in order."""
        return tuple(decode(p) for p in self._state[2])

    def metadata(self) -> tuple[JsonObject, ...]:
        """A fresh copy of each event's metadata, in order."""
        return tuple(_object(decode(m)) for m in self._state[3])

    def kinds(self) -> tuple[str, ...]:
        """Each event's kind, in order."""
        return self._state[1]

    def with_payloads(self, payloads: Sequence[object]) -> CheckedEvents:
        """The same events with new payloads (one per event, in order), each checked as
        an append checks it; kinds and metadata are taken as they are, unchecked again.
        Refuses a bad payload with :class:`~loom_core.errors.InvalidEventError`."""
        return _validation.rebuild_payloads(self, payloads)

    def with_metadata(self, extra: Sequence[JsonObject]) -> CheckedEvents:
        """The same events with ``extra[i]`` merged into event ``i``'s metadata (its keys
        win), only the new keys and values checked. Refuses a bad value or a reserved key
        (``fence``) with :class:`~loom_core.errors.InvalidEventError`."""
        return _validation.rebuild_metadata(self, extra)


def _object(value: JsonValue) -> JsonObject:
    assert isinstance(value, dict)
    return value


def _build(
    kinds: tuple[str, ...],
    payloads: tuple[Encoded, ...],
    metadata: tuple[Encoded, ...],
    answering: tuple[bool, ...],
) -> CheckedEvents:
    """The kernel's constructor: callers have checked every part."""
    batch = _new(CheckedEvents)
    _set_state(batch, (_SEAL, kinds, payloads, metadata, answering))
    return batch


_new: Final = object.__new__
_set_state: Final = CheckedEvents._state.__set__  # type: ignore[attr-defined]


def sealed(events: object) -> CheckedEvents | None:
    """``events`` if the kernel built it (O(1)), else None."""
    if type(events) is CheckedEvents:
        state = getattr(events, "_state", None)
        if state is not None and state[0] is _SEAL:
            return events
    return None


# Last, as validation imports this module: a method call then costs one attribute lookup,
# not an import statement.
from loom_core import validation as _validation  # noqa: E402
