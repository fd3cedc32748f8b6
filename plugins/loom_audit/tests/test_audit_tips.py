"""The remembered chain tip: a fenced append reads no predecessor, and a tip is never used
for a log that moved, was deleted or was re-created under it, by this process or another.

"Two processes" are two decorator instances over one store: one memory store shared by
both, or two storages over one SQLite file or one PostgreSQL schema, each with its own
connections. Every race below is played in an order the test forces.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from loom_audit import AuditEventStore, ChainIntact, read_link

from loom_core import (
    AppendRequest,
    Event,
    EventStore,
    InvalidOptionError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    Storage,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator
from loom_core.memory import MemoryEventStore

BACKENDS = ["memory", "sqlite", "postgresql"]


class CountingReads(EventStoreDecorator):
    """Counts the ``read`` calls made through it (the audit decorator's predecessor reads),
    and holds an append whose first payload is a key of ``before`` until that event is
    set, or its caller after the append landed until the event in ``after`` is set;
    ``landed[key]`` is set once such an append has landed."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.reads = 0
        self.before: dict[object, asyncio.Event] = {}
        self.after: dict[object, asyncio.Event] = {}
        self.landed: defaultdict[object, asyncio.Event] = defaultdict(asyncio.Event)

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
        key = _key(events[0].payload)
        if key in self.before:
            await self.before[key].wait()
        written = await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )
        self.landed[key].set()
        if key in self.after:
            await self.after[key].wait()
        return written

    decisions = Decisions(
        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
        append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
    )


def _key(payload: object) -> object:
    return payload if isinstance(payload, str) else None


@dataclass(frozen=True, slots=True)
class Writers:
    """Two audit decorators over one store: ``a`` (its reads counted) and ``b``."""

    a: AuditEventStore
    b: AuditEventStore
    probe: CountingReads


def _writers(inner_a: EventStore, inner_b: EventStore, tip_cache_size: int = 4096) -> Writers:
    probe = CountingReads(inner_a)
    return Writers(
        AuditEventStore(probe, tip_cache_size=tip_cache_size), AuditEventStore(inner_b), probe
    )


@pytest.fixture(params=BACKENDS)
async def two(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Writers]:
    name: str = request.param
    if name == "memory":
        shared = MemoryEventStore()
        yield _writers(shared, shared)
        return
    if name == "sqlite":
        url, options = f"sqlite:///{tmp_path / 'loom.db'}", {}
    else:
        # Requested only here, so memory and SQLite runs never start a server.
        url = request.getfixturevalue("stack_database")
        options = {"schema": f"tips_{uuid.uuid4().hex[:12]}"}
    first: Storage = await open_storage(url, options=options)
    second: Storage = await open_storage(url, options=options)
    try:
        yield _writers(first.events, second.events)
    finally:
        await second.close()
        await first.close()


def _events(*payloads: object) -> list[NewEvent]:
    return [NewEvent("X", p) for p in payloads]  # type: ignore[arg-type]


async def _linked_in_order(audit: AuditEventStore, execution_id: str) -> None:
    rows = await audit.read_chained(execution_id)
    for before, after in itertools.pairwise(rows):
        link_before, link_after = read_link(before.metadata), read_link(after.metadata)
        assert link_before is not None
        assert link_after is not None
        assert link_after.prev == link_before.hash, f"sequence {after.sequence}"
    verdict = await audit.verify(execution_id)
    assert isinstance(verdict, ChainIntact), verdict
    assert verdict.last_sequence == await audit.head(execution_id) - 1


# -- no read on the fenced path ------------------------------------------------------------


async def test_appends_at_a_remembered_tip_read_no_predecessor() -> None:
    w = _writers(MemoryEventStore(), MemoryEventStore())
    token = await w.a.acquire_fence("f")
    await w.a.append("f", _events(0, 1), expected_sequence=0, fence=token)
    await w.a.append("f", _events(2), expected_sequence=2, fence=token)
    await w.a.append_if_unchanged("f", _events(3), expected_sequence=3, observed_fence=token)
    await w.a.append_many([AppendRequest("f", _events(4, 5), 4, fence=token)])
    await w.a.append("f", _events(6), expected_sequence=6, fence=token)
    assert w.probe.reads == 0

    # A log created unfenced has its tip under token 0; an unfenced append at the tip
    # goes as append_if_unchanged under its token, and so links with no read either.
    await w.a.append("u", _events(0), expected_sequence=0)
    await w.a.append("u", _events(1), expected_sequence=1)
    await w.a.append("u", _events(2), expected_sequence=2, fence=0)
    await w.a.append("u", _events(3), expected_sequence=3)
    assert w.probe.reads == 0

    # A new token is a mismatch: one read, then the tip is under the new token (and an
    # unfenced append goes under it).
    newer = await w.a.acquire_fence("f")
    await w.a.append("f", _events(7), expected_sequence=7, fence=newer)
    await w.a.append("f", _events(8), expected_sequence=8, fence=newer)
    await w.a.append("f", _events(9), expected_sequence=9)
    assert w.probe.reads == 1
    await _linked_in_order(w.a, "f")
    await _linked_in_order(w.a, "u")


async def test_a_tip_cache_of_zero_reads_every_predecessor() -> None:
    w = _writers(MemoryEventStore(), MemoryEventStore(), tip_cache_size=0)
    for i in range(3):
        await w.a.append("e", _events(i), expected_sequence=i, fence=0)
    assert w.probe.reads == 2
    await _linked_in_order(w.a, "e")


@pytest.mark.parametrize("size", [-1, 1.5, True, "4096"])
def test_a_bad_tip_cache_size_is_refused(size: object) -> None:
    with pytest.raises(InvalidOptionError, match="tip_cache_size"):
        AuditEventStore(MemoryEventStore(), tip_cache_size=size)  # type: ignore[arg-type]


async def test_the_audit_option_sets_the_tip_cache_size() -> None:
    async with open_storage(
        "memory://", decorators=[("audit", {"tip_cache_size": 0})]
    ) as storage:
        await storage.events.append("e", _events(0), expected_sequence=0, fence=0)
        await storage.events.append("e", _events(1), expected_sequence=1, fence=0)
    with pytest.raises(InvalidOptionError, match="tip_cache_size"):
        await open_storage("memory://", decorators=[("audit", {"tip_cache_size": -1})])


async def test_beyond_the_bound_the_oldest_tip_is_dropped_and_still_links_correctly() -> None:
    w = _writers(MemoryEventStore(), MemoryEventStore(), tip_cache_size=2)
    for name in ("x1", "x2", "x3"):
        await w.a.append(name, _events(0), expected_sequence=0, fence=0)
    await w.a.append("x3", _events(1), expected_sequence=1, fence=0)
    await w.a.append("x2", _events(1), expected_sequence=1, fence=0)
    assert w.probe.reads == 0
    await w.a.append("x1", _events(1), expected_sequence=1, fence=0)
    assert w.probe.reads == 1, "x1 was the oldest of three"
    for name in ("x1", "x2", "x3"):
        await _linked_in_order(w.a, name)


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
    await _linked_in_order(w.a, "e")


async def test_without_append_if_unchanged_an_unfenced_append_reads_its_predecessor() -> None:
    shared = MemoryEventStore(offer=["acquire_fence", "delete_execution"])
    w = _writers(shared, shared)
    for i in range(3):
        await w.a.append("e", _events(i), expected_sequence=i)
    assert w.probe.reads == 2
    await _linked_in_order(w.a, "e")


# -- another writer moved the log -----------------------------------------------------------


@pytest.mark.parametrize("recreate_to", [1, 2, 3], ids=["behind", "same-head", "ahead"])
async def test_an_unfenced_append_never_links_after_the_tip_of_a_deleted_log(
    two: Writers, recreate_to: int
) -> None:
    await two.a.append("e", _events("a0"), expected_sequence=0)
    await two.a.append("e", _events("a1"), expected_sequence=1)
    # The other process deletes the log and writes a new one, unfenced too.
    assert await two.b.delete_execution("e")
    await two.b.append(
        "e", _events(*[f"b{i}" for i in range(recreate_to)]), expected_sequence=0
    )
    before = await two.b.read_chained("e")
    reads = two.probe.reads
    if recreate_to == 2:
        # The head A's tip expects: its token (0) is refused inside, nothing is written,
        # and the append reads the new predecessor and links after it.
        await two.a.append("e", _events("a2"), expected_sequence=2)
        assert two.probe.reads == reads + 1
        assert [e.payload for e in await two.b.read("e")] == ["b0", "b1", "a2"]
    else:
        with pytest.raises(SequenceConflictError):
            await two.a.append("e", _events("a2"), expected_sequence=2)
        assert await two.b.read_chained("e") == before, "the refused append wrote nothing"
    await _linked_in_order(two.b, "e")




@pytest.mark.parametrize("acquired", [False, True], ids=["token-0", "acquired"])
@pytest.mark.parametrize("b_takes_a_token", [False, True], ids=["b-unfenced", "b-acquires"])
@pytest.mark.parametrize("how", ["append", "append_if_unchanged"])
async def test_a_log_deleted_and_recreated_to_the_same_head_refuses_the_remembered_tip(
    two: Writers, acquired: bool, b_takes_a_token: bool, how: str
) -> None:
    token = await two.a.acquire_fence("e") if acquired else 0
    await two.a.append("e", _events("a0", "a1"), expected_sequence=0, fence=token)
    # The other process deletes the log and writes a new one up to the same head.
    assert await two.b.delete_execution("e")
    b_token = await two.b.acquire_fence("e") if b_takes_a_token else None
    await two.b.append("e", _events("b0", "b1"), expected_sequence=0, fence=b_token)
    before = await two.b.read_chained("e")

    refused = (
        two.a.append("e", _events("a2"), expected_sequence=2, fence=token) if how == "append"
        else two.a.append_if_unchanged(
            "e", _events("a2"), expected_sequence=2, observed_fence=token
        )
    )
    with pytest.raises(StaleFenceError):
        await refused
    assert await two.b.read_chained("e") == before, "the refused append wrote nothing"
    await _linked_in_order(two.a, "e")

    # Under the token it now takes, A's append reads the new predecessor and links to it.
    reads = two.probe.reads
    mine = await two.a.acquire_fence("e")
    await two.a.append("e", _events("a2"), expected_sequence=2, fence=mine)
    assert two.probe.reads == reads + 1
    await _linked_in_order(two.b, "e")


@pytest.mark.parametrize("b_fenced", [False, True], ids=["b-unfenced", "b-same-token"])
async def test_an_append_by_another_writer_refuses_the_tip_and_the_retry_links_after_it(
    two: Writers, b_fenced: bool
) -> None:
    token = await two.a.acquire_fence("e")
    await two.a.append("e", _events("a0", "a1"), expected_sequence=0, fence=token)
    await two.b.append("e", _events("b2"), expected_sequence=2,
                       fence=token if b_fenced else None)

    with pytest.raises(SequenceConflictError) as caught:
        await two.a.append("e", _events("a2"), expected_sequence=2, fence=token)
    assert caught.value.actual_head == 3
    reads = two.probe.reads
    await two.a.append("e", _events("a3"), expected_sequence=3, fence=token)
    assert two.probe.reads == reads + 1, "the refused append dropped the tip"
    await two.a.append("e", _events("a4"), expected_sequence=4, fence=token)
    assert two.probe.reads == reads + 1, "the retry remembered its own tip"
    await _linked_in_order(two.b, "e")


async def test_a_delete_through_the_decorator_forgets_the_tip() -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    await w.a.append("e", _events(0, 1), expected_sequence=0, fence=0)
    assert await w.a.delete_execution("e")
    await w.a.append("e", _events(0, 1), expected_sequence=0, fence=1)
    await w.a.append("e", _events(2), expected_sequence=2, fence=1)
    assert w.probe.reads == 0, "the re-created log's own appends are remembered"
    await w.a.truncate_prefix_keeping("e", keep_from_sequence=1)
    await w.a.append("e", _events(3), expected_sequence=3, fence=1)
    assert w.probe.reads == 1
    verdict = await w.a.verify("e", allow_truncated_prefix=True)
    assert verdict.ok


# -- two appends of one execution in one process ------------------------------------------


@pytest.mark.parametrize("loser_fails_first", [False, True])
async def test_a_refused_append_never_overwrites_the_winners_tip(loser_fails_first: bool) -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    await w.a.append("e", _events(0), expected_sequence=0, fence=0)
    # Both start from the same tip (next 1): the winner's append is held until the loser
    # has begun its own. The winner lands first; the loser is refused either after the
    # winner remembered its tip or before (the winner's task resuming only once the loser
    # has failed).
    loser_began = asyncio.Event()
    loser_failed = asyncio.Event()
    w.probe.before["winner"] = loser_began
    w.probe.before["loser"] = w.probe.landed["winner"]
    if loser_fails_first:
        w.probe.after["winner"] = loser_failed

    async def loser() -> None:
        loser_began.set()  # the append below takes the tip before it first waits
        try:
            await w.a.append("e", _events("loser"), expected_sequence=1, fence=0)
        finally:
            loser_failed.set()

    winning = asyncio.create_task(
        w.a.append("e", _events("winner"), expected_sequence=1, fence=0)
    )
    losing = asyncio.create_task(loser())
    with pytest.raises(SequenceConflictError):
        await losing
    await winning

    reads = w.probe.reads
    await w.a.append("e", _events(2), expected_sequence=2, fence=0)
    assert w.probe.reads == reads, "the winner's tip is remembered"
    assert [e.payload for e in await shared.read("e")] == [0, "winner", 2]
    await _linked_in_order(w.a, "e")


async def test_an_interrupted_append_drops_its_tip() -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    await w.a.append("e", _events(0), expected_sequence=0, fence=0)
    w.probe.before["stuck"] = asyncio.Event()
    stuck = asyncio.create_task(
        w.a.append("e", _events("stuck"), expected_sequence=1, fence=0)
    )
    await asyncio.sleep(0)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    await w.a.append("e", _events(1), expected_sequence=1, fence=0)
    assert w.probe.reads == 1, "the interrupted append may have landed: the tip is not trusted"
    await _linked_in_order(w.a, "e")


async def test_append_many_remembers_each_fenced_request_and_forgets_on_refusal() -> None:
    shared = MemoryEventStore()
    w = _writers(shared, shared)
    await w.a.append_many([
        AppendRequest("f", _events(0), 0, fence=0),
        AppendRequest("u", _events(0), 0),
    ])
    await w.a.append_many([
        AppendRequest("f", _events(1), 1, fence=0),
        AppendRequest("u", _events(1), 1),
    ])
    assert w.probe.reads == 1, "only the unfenced request read its predecessor"
    await w.b.append("f", _events("b"), expected_sequence=2, fence=0)
    with pytest.raises(SequenceConflictError):
        await w.a.append_many([
            AppendRequest("g", _events(0), 0, fence=0),
            AppendRequest("f", _events(2), 2, fence=0),
        ])
    await w.a.append("f", _events(3), expected_sequence=3, fence=0)
    assert w.probe.reads == 2, "the refused batch dropped f's tip"
    for name in ("f", "u"):
        await _linked_in_order(w.a, name)
