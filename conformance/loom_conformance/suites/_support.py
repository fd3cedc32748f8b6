"""Helpers the suites share: building events, snapshots, tokens and parks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import pytest
from hypothesis import HealthCheck, settings

from loom_core import (
    Event,
    EventKind,
    EventStore,
    FenceAcquired,
    FenceNotIssuedError,
    InvalidInputError,
    JsonValue,
    NewEvent,
)

__all__ = [
    "GUARD_SECONDS",
    "PROBE_FENCE",
    "SAME_VALUES",
    "Snapshot",
    "app",
    "assert_refused_alike_when_closed",
    "assert_the_same_values",
    "bump_token",
    "close_iterator",
    "guard",
    "kernel",
    "list_pages",
    "nested",
    "park",
    "scribble",
    "snapshot",
    "token_of",
]

SAME_VALUES: Final[tuple[JsonValue, ...]] = (
    1.0, -0.0, 1e300, 1e16, 5e-324, -1.5e-7, 2**64 + 5, -(2**63) - 1,
    True, 1, False, 0, "\u2028\U0001f9f5", {"b": 1.0, "a": [-0.0, 2.0], "": True},
    {"z": 2**64 + 5, "a": 1.0},  # past 64 bits: JSON text of another encoder
)
"""Payloads a store must hand back as the same values, not only equal ones: 1.0 == 1 and
-0.0 == 0.0, and dicts compare without their order. A workflow is served on replay what
the store hands back, and must see what it saw when the value was recorded; a store that
normalises JSON as PostgreSQL jsonb does (1.0 and 1e300 back as integers, -0.0 as 0, keys
in its own order) lets a replay take another branch."""


def assert_the_same_values(what: str, events: Sequence[Event]) -> None:
    """``events`` carry :data:`SAME_VALUES` as their payloads, type, sign and key order
    included; ``what`` names the call that handed them back."""
    assert [repr(e.payload) for e in events] == [repr(p) for p in SAME_VALUES], (
        f"{what} handed back payloads that are equal but not the same values: a float "
        "must stay a float (1.0, not 1), -0.0 keep its sign, and an object's keys keep "
        "the order they were written in"
    )


GUARD_SECONDS: Final = 10.0
"""How long a test waits for something that must happen before calling the store hung.
A guard against hanging the run, never an assertion about speed."""

_T = TypeVar("_T")


def kernel(kind: EventKind, payload: JsonValue = None) -> NewEvent:
    return NewEvent(kind.value, payload)


def app(kind: str = "order.placed", payload: JsonValue = None, **metadata: JsonValue) -> NewEvent:
    return NewEvent(kind, payload, metadata)


async def guard(awaitable: Awaitable[_T]) -> _T:
    return await asyncio.wait_for(awaitable, GUARD_SECONDS)


async def assert_refused_alike_when_closed(
    calls: Sequence[tuple[str, Callable[[], Awaitable[object]]]],
    close: Callable[[], Awaitable[object]],
    what: str,
) -> None:
    """Each of ``calls`` (named, each with a bad argument) raises an InvalidInputError on
    the open store, then, once ``close()`` has run, the very same type: arguments are
    checked before the store is, never StoreClosedError for a bad call."""
    open_errors: dict[str, type[BaseException]] = {}
    for name, call in calls:
        with pytest.raises(InvalidInputError) as caught:
            await guard(call())
        open_errors[name] = type(caught.value)
    await close()
    wrong: list[str] = []
    for name, call in calls:
        try:
            await guard(call())
        except Exception as exc:
            if type(exc) is not open_errors[name]:
                wrong.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            wrong.append(f"{name}: returned normally")
    assert not wrong, (
        f"calls with a bad argument on a closed {what} that did not raise the "
        f"InvalidInputError an open one raises: {wrong}"
    )


def nested(kind: str = "order.placed", n: int = 0) -> NewEvent:
    """An event whose payload and metadata hold containers inside containers, so that a
    store sharing any level of them with a caller is caught by :func:`scribble`."""
    return NewEvent(kind, {"n": n, "items": [1, {"deep": ["x"]}]}, {"trace": {"path": [n]}})


SCRIBBLED: Final = "loom.kit.scribbled"


def scribble(events: Iterable[Event]) -> None:
    """Change, in place, every dict and list inside each event's payload and metadata, as
    a careless caller may: a store that handed out objects it still holds (or hands to
    another caller) shows the change where it must not."""
    for event in events:
        _scribble(event.payload)
        _scribble(event.metadata)


def _scribble(value: JsonValue) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _scribble(item)
        value[SCRIBBLED] = True
    elif isinstance(value, list):
        for item in value:
            _scribble(item)
        value.append(SCRIBBLED)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a caller can observe of an event store through the required methods."""

    executions: tuple[str, ...]
    heads: tuple[int, ...]
    logs: tuple[tuple[Event, ...], ...]


MAX_PAGES: Final = 1_000
"""More pages than any kit test writes: a listing that is still going is looping."""


async def list_pages(store: EventStore, *, limit: int = 100) -> list[tuple[str, ...]]:
    """Every page of ``list_executions``, following ``after``; fails (never hangs) when a
    page does not move strictly forward, naming the page that repeated."""
    pages: list[tuple[str, ...]] = []
    after: str | None = None
    for _ in range(MAX_PAGES):
        page = await store.list_executions(after=after, limit=limit)
        if not page:
            return pages
        assert len(page) <= limit, f"list_executions(limit={limit}) returned {len(page)} ids"
        if after is not None and page[0] <= after:
            raise AssertionError(
                f"list_executions(after={after!r}) returned {page!r}, which starts at or "
                f"before {after!r}: `after` is exclusive, so paging would repeat forever"
            )
        pages.append(page)
        if len(page) < limit:
            return pages
        after = page[-1]
    raise AssertionError(f"list_executions still returned ids after {MAX_PAGES} pages")


async def snapshot(store: EventStore, *also: str) -> Snapshot:
    """The listed executions (plus ``also``, which may not exist) with heads and logs."""
    listed = [i for page in await list_pages(store) for i in page]
    ids = sorted({*listed, *also})
    heads = tuple([await store.head(i) for i in ids])
    logs = tuple([await store.read(i) for i in ids])
    return Snapshot(tuple(listed), heads, logs)


PROBE_FENCE: Final = 2**62
"""A token no test ever reaches: presenting it must raise FenceNotIssuedError."""


async def token_of(store: EventStore, execution_id: str) -> int:
    """The execution's current token, read without changing anything: an append under a
    token that was never issued is refused with the current one (and writes nothing)."""
    head = await store.head(execution_id)
    try:
        written = await store.append(
            execution_id, [NewEvent("loom.kit.token-probe")], expected_sequence=head,
            fence=PROBE_FENCE,
        )
    except FenceNotIssuedError as refused:
        return refused.current_fence
    raise AssertionError(
        f"append(fence={PROBE_FENCE}) to {execution_id!r} was accepted ({len(written)} "
        "event(s) written): a token above the current one must raise FenceNotIssuedError"
    )


async def bump_token(store: EventStore, execution_id: str) -> int:
    """Raise the execution's token by one with whichever acquire the store offers."""
    if "acquire_fence" in store.capabilities:
        return await store.acquire_fence(execution_id)
    if "acquire_fence_if" not in store.capabilities:
        pytest.skip("the store offers neither acquire_fence nor acquire_fence_if")
    head = await store.head(execution_id)
    if head == 0:
        pytest.skip(
            "only acquire_fence gives a token to an execution with no log "
            "(acquire_fence_if refuses one), and the store does not offer it"
        )
    # Nothing sits past the newest event, so only the token decides.
    current = await token_of(store, execution_id)
    result = await store.acquire_fence_if(execution_id, fence=current, park_seq=head - 1)
    assert isinstance(result, FenceAcquired), f"acquire_fence_if with the current token: {result}"
    return result.fence


async def park(
    store: EventStore, execution_id: str, *, fence: int | None = None,
    before: Sequence[NewEvent] = (),
) -> int:
    """Start ``execution_id`` and park it (EXECUTION_SUSPENDED, written under ``fence``);
    return the park's sequence."""
    head = await store.head(execution_id)
    events = [kernel(EventKind.EXECUTION_STARTED), *before] if head == 0 else list(before)
    events.append(kernel(EventKind.EXECUTION_SUSPENDED, {"waiting_on": "signal"}))
    written = await store.append(execution_id, events, expected_sequence=head, fence=fence)
    return written[-1].sequence


async def close_iterator(iterator: AsyncIterator[Event]) -> None:
    """Close a subscription (an async generator has ``aclose``; a plain iterator has not)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def drawn_settings(examples: int) -> settings:
    """Hypothesis settings of a kit test that draws its cases: ``examples`` of them, the
    same on every run (``derandomize``, no example database), and no deadline, since
    nothing in the kit is a duration. Each example works on executions of its own in the
    store the fixture gave, and a project may run a suite under several classes (one per
    store), so the health checks about function-scoped fixtures and executors do not
    apply; neither does the one about slow data generation (a real store is slow)."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,
        ],
    )


def field_of(event: Event, key: str) -> JsonValue:
    """``event.payload[key]`` of a runtime event (whose payload is a JSON object)."""
    assert isinstance(event.payload, dict), f"event {event.sequence}: {event.payload!r}"
    return event.payload.get(key)
