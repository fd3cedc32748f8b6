"""The store under test against the in-memory reference, on drawn sequences of calls.

Hypothesis draws a short program of event-store calls over two executions: appends of
one to three events (application events, parks, answers, an application event marked as a
kernel kind) at the head or beside it, under no fence, the current token or one beside it;
``acquire_fence``, ``acquire_fence_if`` against the current token or another and a park
sequence at or below the head; ``append_if_unchanged``, ``append_many`` across both,
``delete_execution``, ``copy_prefix``, ``truncate_prefix_keeping``, ``read`` with bounds,
``head`` and ``list_executions`` with a small limit. Each call is made on the store under
test and on a fresh :class:`~loom_core.memory.MemoryEventStore` (the kernel's reference),
and the two must answer alike: the same events (execution, sequence, kind, payload,
fence), the same tokens, the same error class carrying the same data. At the end every
log, head and token must be the same on both.

A call the store does not offer (``capabilities``) is never drawn. A call over several
executions (``append_many``, ``copy_prefix``) that the store refuses with an
``InvalidInputError`` of its own (not a kernel error: a sharded store's refusal across
shards, say) is not made on the reference, and the store must then be exactly as the
reference is. Each example works on executions of its own, so one store serves every
example; the draws are the same on every run (``derandomize``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeAlias

from hypothesis import event, given
from hypothesis import strategies as st

from loom_conformance.suites._support import drawn_settings, token_of
from loom_core import (
    AppendRequest,
    Event,
    EventKind,
    EventStore,
    FenceAcquired,
    FenceStale,
    InvalidInputError,
    JsonValue,
    LoomError,
    NewEvent,
)
from loom_core.memory import MemoryEventStore
from loom_core.spi import OptionalMethod

__all__ = ["EventStoreReferenceContract"]

EXAMPLES: Final = 100
"""Programs per run of the suite (the same ones every run)."""
IDS: Final = ("a", "b")
_EXAMPLE: Final = itertools.count()

Call: TypeAlias = tuple[Any, ...]
"""One drawn call: its name, then its arguments, with sequences and tokens drawn relative
to the execution's head and token on the reference, resolved when the call is made."""

_KINDS: Final[tuple[tuple[str, dict[str, JsonValue]], ...]] = (
    ("order.placed", {}),
    (EventKind.EXECUTION_SUSPENDED.value, {}),
    (EventKind.EXECUTION_RESUMED.value, {}),
    (EventKind.STEP_COMPLETED.value, {}),
    ("newer.kernel.kind", {"kernel": True}),
)

_ids = st.sampled_from(range(len(IDS)))
_events = st.lists(
    st.tuples(st.sampled_from(range(len(_KINDS))), st.integers(min_value=0, max_value=9)),
    min_size=1,
    max_size=3,
)
# Mostly the call that is accepted (at the head, under the current token), so the logs
# grow and the later calls meet something; now and then one beside it.
_at_head = st.sampled_from(
    [("head", 0)] * 4 + [("head", -1), ("head", 1), ("abs", 0), ("abs", 2)]
)
_below_head = st.tuples(st.just("head"), st.integers(min_value=-3, max_value=0))
_token = st.sampled_from([("token", 0)] * 3 + [("token", -1), ("token", 1)])
_fence = st.one_of(st.none(), _token)


def _calls(offered: frozenset[str]) -> st.SearchStrategy[Call]:
    append = st.tuples(st.just("append"), _ids, _events, _at_head, _fence)
    calls = [
        append,
        append,
        st.tuples(st.just("read"), _ids, _below_head, st.one_of(st.none(), _at_head),
                  st.one_of(st.none(), st.integers(min_value=1, max_value=3))),
        st.tuples(st.just("head"), _ids),
        st.tuples(st.just("list"), st.one_of(st.none(), _ids),
                  st.integers(min_value=1, max_value=3)),
    ]
    optional: dict[OptionalMethod, st.SearchStrategy[Call]] = {
        "acquire_fence": st.tuples(st.just("acquire_fence"), _ids),
        "acquire_fence_if": st.tuples(st.just("acquire_fence_if"), _ids, _token, _below_head),
        "append_if_unchanged": st.tuples(
            st.just("append_if_unchanged"), _ids, _events, _at_head, _token
        ),
        "append_many": st.tuples(
            st.just("append_many"),
            st.lists(st.tuples(_ids, _events, _at_head, _fence), min_size=1, max_size=3),
        ),
        "delete_execution": st.tuples(st.just("delete_execution"), _ids),
        "copy_prefix": st.tuples(st.just("copy_prefix"), _ids, _ids, _below_head),
        "truncate_prefix_keeping": st.tuples(
            st.just("truncate_prefix_keeping"), _ids, _below_head
        ),
    }
    calls.extend(call for method, call in optional.items() if method in offered)
    return st.one_of(*calls)


@dataclass(frozen=True, slots=True)
class _Pair:
    """The store under test and the reference, on one example's executions."""

    store: EventStore
    reference: EventStore
    prefix: str

    def id(self, index: int) -> str:
        return f"{self.prefix}{IDS[index]}"

    async def sequence(self, index: int, drawn: tuple[str, int]) -> int:
        base = await self.reference.head(self.id(index)) if drawn[0] == "head" else 0
        return max(base + drawn[1], 0)

    async def token(self, index: int, drawn: tuple[str, int] | None) -> int | None:
        if drawn is None:
            return None
        return max(await token_of(self.reference, self.id(index)) + drawn[1], 0)


def _new_events(drawn: list[tuple[int, int]]) -> list[NewEvent]:
    return [NewEvent(_KINDS[k][0], {"n": n}, dict(_KINDS[k][1])) for k, n in drawn]


class _SeenEvent(NamedTuple):
    """An event as the comparison sees it, each field named in a failure's message (a
    bare tuple left a store author to guess that its last item was the fence)."""

    execution_id: str
    sequence: int
    kind: str
    payload: object
    fence: int

    def __repr__(self) -> str:
        return (
            f"Event(execution_id={self.execution_id!r}, sequence={self.sequence}, "
            f"kind={self.kind!r}, payload={self.payload!r}, fence={self.fence})"
        )


class _SeenLog(NamedTuple):
    """One execution as the final comparison sees it, each part named."""

    execution_id: str
    head: int
    events: object
    token: int

    def __repr__(self) -> str:
        return (
            f"Log(execution_id={self.execution_id!r}, head={self.head}, "
            f"events={self.events!r}, token={self.token})"
        )


def _seen(value: object) -> object:
    """What a call's answer says, with what a store may word or stamp its own way left
    out: an event's ``recorded_at`` and any metadata beside ``fence``."""
    if isinstance(value, Event):
        return _SeenEvent(
            value.execution_id, value.sequence, value.kind, value.payload, value.fence
        )
    if isinstance(value, tuple | list):
        return tuple(_seen(item) for item in value)
    if isinstance(value, FenceAcquired | FenceStale):
        return (type(value).__name__, value.fence)
    return value


_SPANNING: Final = frozenset({"append_many", "copy_prefix"})
"""Calls over several executions, which a store that cannot make them atomic (a sharded
one, across shards) may refuse with an ``InvalidInputError`` of its own."""


@dataclass(frozen=True, slots=True)
class _Refused:
    """A refusal: the error's class, where it is defined, and the data it carries."""

    name: str
    module: str
    data: tuple[tuple[str, object], ...]
    invalid_input: bool

    @property
    def own(self) -> bool:
        """Not a kernel error: the store's (or a decorator's) own refusal."""
        return not self.module.startswith("loom_core")


def _refusal(exc: LoomError) -> _Refused:
    return _Refused(
        type(exc).__name__,
        type(exc).__module__,
        tuple(sorted((k, v) for k, v in vars(exc).items() if not k.startswith("_"))),
        isinstance(exc, InvalidInputError),
    )


async def _resolve(pair: _Pair, call: Call) -> Call:
    """``call`` with its ids, sequences and tokens made concrete, from the reference's
    state before the call (both stores then get the very same arguments)."""
    name = call[0]
    if name in ("append", "append_if_unchanged"):
        _, i, events, at, fence = call
        return (name, pair.id(i), _new_events(events), await pair.sequence(i, at),
                await pair.token(i, fence))
    if name == "read":
        _, i, start, stop, limit = call
        return (name, pair.id(i), await pair.sequence(i, start),
                None if stop is None else await pair.sequence(i, stop), limit)
    if name in ("head", "acquire_fence", "delete_execution"):
        return (name, pair.id(call[1]))
    if name == "list":
        # After the example's prefix, or after one of its ids: its own executions come
        # first in the store's order, before any other example's.
        _, after, limit = call
        return (name, pair.prefix if after is None else pair.id(after), limit, pair.prefix)
    if name == "acquire_fence_if":
        _, i, fence, park = call
        return (name, pair.id(i), await pair.token(i, fence), await pair.sequence(i, park))
    if name == "append_many":
        return (name, [
            AppendRequest(
                pair.id(i), _new_events(events), expected_sequence=await pair.sequence(i, at),
                fence=await pair.token(i, fence),
            )
            for i, events, at, fence in call[1]
        ])
    if name == "copy_prefix":
        _, source, target, through = call
        return (name, pair.id(source), pair.id(target), await pair.sequence(source, through))
    assert name == "truncate_prefix_keeping", call
    _, i, keep = call
    return (name, pair.id(i), await pair.sequence(i, keep))


async def _answer(store: EventStore, call: Call) -> object:
    """Make the resolved ``call`` on ``store``; its answer, or its refusal's class and
    data."""
    name, *args = call
    try:
        if name == "append":
            execution_id, events, at, fence = args
            return _seen(await store.append(
                execution_id, events, expected_sequence=at, fence=fence
            ))
        if name == "append_if_unchanged":
            execution_id, events, at, fence = args
            return _seen(await store.append_if_unchanged(
                execution_id, events, expected_sequence=at, observed_fence=fence or 0
            ))
        if name == "read":
            execution_id, start, stop, limit = args
            return _seen(await store.read(
                execution_id, from_sequence=start, to_sequence=stop, limit=limit
            ))
        if name == "head":
            return await store.head(args[0])
        if name == "list":
            after, limit, prefix = args
            listed = await store.list_executions(after=after, limit=limit)
            return tuple(i for i in listed if i.startswith(prefix))
        if name == "acquire_fence":
            return await store.acquire_fence(args[0])
        if name == "acquire_fence_if":
            execution_id, fence, park = args
            return _seen(await store.acquire_fence_if(
                execution_id, fence=fence or 0, park_seq=park
            ))
        if name == "append_many":
            return _seen(await store.append_many(args[0]))
        if name == "delete_execution":
            return await store.delete_execution(args[0])
        if name == "copy_prefix":
            source, target, through = args
            return await store.copy_prefix(source, target, through_sequence=through)
        assert name == "truncate_prefix_keeping", call
        execution_id, keep = args
        return await store.truncate_prefix_keeping(execution_id, keep_from_sequence=keep)
    except LoomError as refused:
        return _refusal(refused)


async def _state(store: EventStore, pair: _Pair) -> object:
    return [
        _SeenLog(
            pair.id(i), await store.head(pair.id(i)), _seen(await store.read(pair.id(i))),
            await token_of(store, pair.id(i)),
        )
        for i in range(len(IDS))
    ]


class EventStoreReferenceContract:
    """Drawn programs of calls: the store under test answers as the in-memory reference
    does, call by call, and ends in the same state (see the module docstring)."""

    @drawn_settings(EXAMPLES)
    @given(data=st.data())
    async def test_drawn_calls_answer_as_the_reference_does(
        self, loom_events: EventStore, data: st.DataObject
    ) -> None:
        offered = frozenset(loom_events.capabilities)
        program = data.draw(st.lists(_calls(offered), min_size=4, max_size=16), label="program")
        reference = MemoryEventStore()
        pair = _Pair(loom_events, reference, f"ref-{next(_EXAMPLE)}-")
        try:
            for step, drawn in enumerate(program):
                call = await _resolve(pair, drawn)
                answered = await _answer(loom_events, call)
                if (
                    isinstance(answered, _Refused)
                    and answered.own
                    and call[0] in _SPANNING
                    and answered.invalid_input
                ):
                    # Refused as a call the store cannot make atomic: the reference is not
                    # asked, and the store must be where it was (as the reference is).
                    assert await _state(loom_events, pair) == await _state(reference, pair), (
                        f"call {step} {call!r} was refused ({answered!r}) and changed the store"
                    )
                    continue
                expected = await _answer(reference, call)
                event(f"{call[0]}: " + (
                    expected.name if isinstance(expected, _Refused) else "answered"
                ))
                assert answered == expected, (
                    f"call {step} {call!r}: the store answered {answered!r}, "
                    f"the reference {expected!r}"
                )
            ended, expected_end = await _state(loom_events, pair), await _state(reference, pair)
            assert ended == expected_end, (
                f"after the program the store holds {ended!r}, the reference {expected_end!r}"
            )
        finally:
            await reference.close()

