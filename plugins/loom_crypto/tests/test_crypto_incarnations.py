"""The remembered incarnation: a fenced append under a token one of the decorator's own
fenced appends landed under reads no first event, and a remembered incarnation is never
written into a log that was deleted and re-created under it, by this process or another.

"Two processes" are two decorator instances with one key store over one store: one memory
store shared by both, or two storages over one SQLite file, each with its own connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from loom_crypto import CryptoEventStore, KeyStore, MemoryKeyStore, subject_is_execution

from loom_core import (
    AppendRequest,
    Event,
    EventStore,
    InvalidOptionError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator
from loom_core.memory import MemoryEventStore

INCARNATION = "$loom_incarnation"


class CountingReads(EventStoreDecorator):
    """Counts the ``read`` calls made through it (the crypto decorator's reads of a log's
    first event, when nothing else reads through it), and holds the caller of an append
    under a token in ``hold`` after it landed, until that event is set."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.reads = 0
        self.hold: dict[int, asyncio.Event] = {}
        self.landed = asyncio.Event()

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        self.reads += 1
        return await self.inner.read(
            execution_id, from_sequence=from_sequence, to_sequence=to_sequence, limit=limit
        )

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        written = await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )
        if fence in self.hold:
            self.landed.set()
            await self.hold[fence].wait()
        return written

    decisions = Decisions(
        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
        append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
    )


@dataclass(frozen=True, slots=True)
class Writers:
    """Two crypto decorators over one store and one key store: ``a`` (its reads counted)
    and ``b``; ``raw`` reads the rows as stored."""

    a: CryptoEventStore
    b: CryptoEventStore
    probe: CountingReads
    raw: EventStore


def _writers(
    inner_a: EventStore, inner_b: EventStore, size: int = 4096, keys: KeyStore | None = None
) -> Writers:
    keys = keys or MemoryKeyStore()
    probe = CountingReads(inner_a)
    return Writers(
        CryptoEventStore(
            probe, key_store=keys, subject_of=subject_is_execution,
            incarnation_cache_size=size,
        ),
        CryptoEventStore(inner_b, key_store=keys, subject_of=subject_is_execution),
        probe,
        inner_b,
    )


@pytest.fixture(params=["memory", "sqlite"])
async def two(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Writers]:
    if request.param == "memory":
        shared = MemoryEventStore()
        yield _writers(shared, shared)
        return
    url = f"sqlite:///{tmp_path / 'loom.db'}"
    async with open_storage(url) as first, open_storage(url) as second:
        yield _writers(first.events, second.events)


def _events(*payloads: int | str) -> list[NewEvent]:
    return [NewEvent("X", {"v": p}) for p in payloads]


async def _one_incarnation(w: Writers, execution_id: str) -> tuple[list[object], str]:
    """The log's payloads as ``a`` reads them (every event opens under the log's one
    incarnation, or the read refuses), and that incarnation as stored."""
    opened = await w.a.read(execution_id)
    stamps = {event.metadata[INCARNATION] for event in await w.raw.read(execution_id)}
    assert len(stamps) == 1, stamps
    stamp = stamps.pop()
    assert isinstance(stamp, str)
    return [event.payload["v"] for event in opened], stamp  # type: ignore[index, call-overload]


async def test_appends_after_a_remembered_one_read_no_first_event() -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    token = await w.a.acquire_fence("f")
    await w.a.append("f", _events(0, 1), expected_sequence=0, fence=token)
    await w.a.append("f", _events(2), expected_sequence=2, fence=token)
    await w.a.append_if_unchanged("f", _events(3), expected_sequence=3, observed_fence=token)
    await w.a.append_many([AppendRequest("f", _events(4, 5), 4, fence=token)])
    await w.a.append("f", _events(6), expected_sequence=6, fence=token)
    assert w.probe.reads == 0

    # A log created unfenced is remembered under token 0; unfenced appends go as
    # append_if_unchanged under it, and so does a fenced one under 0.
    await w.a.append("u", _events(0), expected_sequence=0)
    await w.a.append("u", _events(1), expected_sequence=1)
    await w.a.append("u", _events(2), expected_sequence=2, fence=0)
    await w.a.append("u", _events(3), expected_sequence=3)
    assert w.probe.reads == 0

    # A new token is not the remembered one: one read, then the new token is remembered,
    # and an unfenced append goes under it.
    newer = await w.a.acquire_fence("f")
    await w.a.append("f", _events(7), expected_sequence=7, fence=newer)
    await w.a.append("f", _events(8), expected_sequence=8, fence=newer)
    await w.a.append("f", _events(9), expected_sequence=9)
    assert w.probe.reads == 1
    assert (await _one_incarnation(w, "f"))[0] == list(range(10))
    assert (await _one_incarnation(w, "u"))[0] == list(range(4))


async def test_an_append_at_another_head_under_the_remembered_token_reads_nothing(
    two: Writers,
) -> None:
    # Another writer's event in between (under the same token, or none) moves the head
    # but not the incarnation: the remembered one is still the log's.
    await two.a.append("e", _events("a0"), expected_sequence=0, fence=0)
    await two.b.append("e", _events("b1"), expected_sequence=1)
    await two.b.append("e", _events("b2"), expected_sequence=2, fence=0)
    with pytest.raises(SequenceConflictError):
        await two.a.append("e", _events("a1"), expected_sequence=1, fence=0)
    await two.a.append("e", _events("a3"), expected_sequence=3, fence=0)
    assert two.probe.reads == 0
    assert (await _one_incarnation(two, "e"))[0] == ["a0", "b1", "b2", "a3"]


@pytest.mark.parametrize("acquired", [False, True], ids=["token-0", "acquired"])
@pytest.mark.parametrize("b_takes_a_token", [False, True], ids=["b-unfenced", "b-acquires"])
@pytest.mark.parametrize("how", ["append", "append_if_unchanged", "append_many"])
async def test_a_log_deleted_and_recreated_never_gets_the_remembered_incarnation(
    two: Writers, acquired: bool, b_takes_a_token: bool, how: str
) -> None:
    token = await two.a.acquire_fence("e") if acquired else 0
    await two.a.append("e", _events("a0", "a1"), expected_sequence=0, fence=token)
    _, old = await _one_incarnation(two, "e")
    # The other process deletes the log and writes a new one up to the same head.
    assert await two.b.delete_execution("e")
    b_token = await two.b.acquire_fence("e") if b_takes_a_token else None
    await two.b.append("e", _events("b0", "b1"), expected_sequence=0, fence=b_token)
    before = await two.raw.read("e")
    _, new = await _one_incarnation(two, "e")
    assert new != old

    with pytest.raises(StaleFenceError):
        await _append_as(two.a, how, "e", _events("a2"), 2, token)
    assert await two.raw.read("e") == before, "the refused append wrote nothing"

    # Under the token it now takes, A's append reads the new log's first event and
    # continues its incarnation: the log still reads, as one incarnation.
    reads = two.probe.reads
    mine = await two.a.acquire_fence("e")
    await two.a.append("e", _events("a2"), expected_sequence=2, fence=mine)
    assert two.probe.reads == reads + 1
    assert await _one_incarnation(two, "e") == (["b0", "b1", "a2"], new)


async def _append_as(
    store: CryptoEventStore, how: str, execution_id: str, events: list[NewEvent],
    sequence: int, token: int,
) -> None:
    if how == "append":
        await store.append(execution_id, events, expected_sequence=sequence, fence=token)
    elif how == "append_if_unchanged":
        await store.append_if_unchanged(
            execution_id, events, expected_sequence=sequence, observed_fence=token
        )
    else:
        await store.append_many([AppendRequest(execution_id, events, sequence, fence=token)])


@pytest.mark.parametrize("recreate_to", [1, 2, 3], ids=["behind", "same-head", "ahead"])
async def test_an_unfenced_append_never_writes_the_remembered_incarnation_into_a_new_log(
    two: Writers, recreate_to: int
) -> None:
    await two.a.append("e", _events("a0"), expected_sequence=0)
    await two.a.append("e", _events("a1"), expected_sequence=1)
    _, old = await _one_incarnation(two, "e")
    # The other process deletes the log and writes a new one, unfenced too.
    assert await two.b.delete_execution("e")
    await two.b.append("e", _events(*[f"b{i}" for i in range(recreate_to)]), expected_sequence=0)
    _, new = await _one_incarnation(two, "e")
    assert new != old

    reads = two.probe.reads
    if recreate_to == 2:
        # The head A expects: its remembered token (0) is refused inside, nothing is
        # written, and the append goes on with the new log's first event.
        await two.a.append("e", _events("a2"), expected_sequence=2)
        assert two.probe.reads == reads + 1
        # Not remembered after that: the next unfenced append reads too.
        await two.a.append("e", _events("a3"), expected_sequence=3)
        assert two.probe.reads == reads + 2
        assert await _one_incarnation(two, "e") == (["b0", "b1", "a2", "a3"], new)
    else:
        with pytest.raises(SequenceConflictError):
            await two.a.append("e", _events("a2"), expected_sequence=2)
        assert (await _one_incarnation(two, "e"))[1] == new


async def test_a_wrong_guess_costs_one_refused_write_then_reads() -> None:
    # The id was deleted before, so its token is 1 when A creates it unfenced.
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    await w.a.append("e", _events(0), expected_sequence=0)
    assert await w.a.delete_execution("e")
    await w.a.append("e", _events(0), expected_sequence=0)
    await w.a.append("e", _events(1), expected_sequence=1)
    await w.a.append("e", _events(2), expected_sequence=2)
    assert w.probe.reads == 2
    assert (await _one_incarnation(w, "e"))[0] == [0, 1, 2]


async def test_without_append_if_unchanged_an_unfenced_append_reads_the_first_event() -> None:
    shared = MemoryEventStore(offer=["acquire_fence", "delete_execution"])
    w = _writers(shared, shared)
    for i in range(3):
        await w.a.append("e", _events(i), expected_sequence=i)
    assert w.probe.reads == 2
    token = await w.a.acquire_fence("e")
    await w.a.append("e", _events(3), expected_sequence=3, fence=token)
    await w.a.append("e", _events(4), expected_sequence=4, fence=token)
    assert w.probe.reads == 3
    assert (await _one_incarnation(w, "e"))[0] == [0, 1, 2, 3, 4]


async def test_a_cache_of_zero_reads_every_first_event() -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared, size=0)
    for i in range(3):
        await w.a.append("e", _events(i), expected_sequence=i, fence=0)
    assert w.probe.reads == 2
    assert (await _one_incarnation(w, "e"))[0] == [0, 1, 2]


async def test_beyond_the_bound_the_oldest_is_dropped_and_read_again() -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared, size=2)
    for name in ("x1", "x2", "x3"):
        await w.a.append(name, _events(0), expected_sequence=0, fence=0)
    await w.a.append("x3", _events(1), expected_sequence=1, fence=0)
    await w.a.append("x2", _events(1), expected_sequence=1, fence=0)
    assert w.probe.reads == 0
    await w.a.append("x1", _events(1), expected_sequence=1, fence=0)
    assert w.probe.reads == 1, "x1 was the oldest of three"
    for name in ("x1", "x2", "x3"):
        assert (await _one_incarnation(w, name))[0] == [0, 1]


async def test_an_unfenced_append_keeps_its_execution_among_the_newest() -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared, size=2)
    await w.a.append("x1", _events(0), expected_sequence=0)
    await w.a.append("x2", _events(0), expected_sequence=0)
    await w.a.append("x1", _events(1), expected_sequence=1)  # x2 is now the oldest
    await w.a.append("x3", _events(0), expected_sequence=0)
    await w.a.append("x1", _events(2), expected_sequence=2)
    assert w.probe.reads == 0
    await w.a.append("x2", _events(1), expected_sequence=1)
    assert w.probe.reads == 1, "x2 was dropped"
    for name, count in (("x1", 3), ("x2", 2), ("x3", 1)):
        assert (await _one_incarnation(w, name))[0] == list(range(count))


async def test_a_stale_append_leaves_the_newer_token_remembered() -> None:
    # Two runs of one execution in one process: the stale one's late append is refused and
    # leaves the newer token remembered.
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    await w.a.append("e", _events(0), expected_sequence=0, fence=0)
    newer = await w.a.acquire_fence("e")
    await w.a.append("e", _events(1), expected_sequence=1, fence=newer)
    with pytest.raises(StaleFenceError):
        await w.a.append("e", _events("stale"), expected_sequence=2, fence=0)
    reads = w.probe.reads
    await w.a.append("e", _events(2), expected_sequence=2, fence=newer)
    assert w.probe.reads == reads
    assert (await _one_incarnation(w, "e"))[0] == [0, 1, 2]


async def test_an_append_that_returns_late_never_replaces_a_newer_token() -> None:
    # The older run's append lands, then its task is held before it returns; meanwhile a
    # newer run takes a token and appends. The late return remembers the older token only
    # if nothing newer is remembered.
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    await w.a.append("e", _events(0), expected_sequence=0, fence=0)
    release = w.probe.hold[0] = asyncio.Event()
    late = asyncio.create_task(w.a.append("e", _events(1), expected_sequence=1, fence=0))
    await w.probe.landed.wait()
    newer = await w.a.acquire_fence("e")
    await w.a.append("e", _events(2), expected_sequence=2, fence=newer)
    release.set()
    await late
    reads = w.probe.reads
    await w.a.append("e", _events(3), expected_sequence=3, fence=newer)
    assert w.probe.reads == reads, "the newer token is still the remembered one"
    assert (await _one_incarnation(w, "e"))[0] == [0, 1, 2, 3]


@pytest.mark.parametrize("size", [-1, 1.5, True, "4096"])
def test_a_bad_cache_size_is_refused(size: object) -> None:
    with pytest.raises(InvalidOptionError, match="incarnation_cache_size"):
        CryptoEventStore(
            MemoryEventStore(), key_store=MemoryKeyStore(), subject_of=subject_is_execution,
            incarnation_cache_size=size,  # type: ignore[arg-type]
        )


async def test_the_crypto_option_sets_the_cache_size() -> None:
    options: dict[str, object] = {
        "key_store": MemoryKeyStore(), "subject_of": subject_is_execution,
        "incarnation_cache_size": 0,
    }
    async with open_storage("memory://", decorators=[("crypto", options)]) as storage:
        await storage.events.append("e", _events(0), expected_sequence=0, fence=0)
        await storage.events.append("e", _events(1), expected_sequence=1, fence=0)
        assert [e.payload for e in await storage.events.read("e")] == [{"v": 0}, {"v": 1}]
    with pytest.raises(InvalidOptionError, match="incarnation_cache_size"):
        await open_storage(
            "memory://", decorators=[("crypto", {**options, "incarnation_cache_size": -1})]
        )
