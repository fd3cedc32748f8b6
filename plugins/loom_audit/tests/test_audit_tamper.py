"""The tamper test: 50 chains of 100 events, 5,500 mutations, every one detected.

The chains are written through the decorator (some batches fenced, so the stamps are
covered too), then read back as the rows a database holds. Each mutation is what someone
with write access could do to those rows without recomputing any hash:

- flip: one bit of one byte of an event's stored (kind, payload, metadata) JSON, kept only
  when the result still parses and means something different;
- reorder: two events' contents swapped (adjacent or not), sequences left in place;
- delete: a middle event removed, leaving a gap or with later events renumbered;
- insert: a replayed copy of an event, or a forged one (with a copied link, or with a link
  correctly computed over its predecessor), with later events renumbered or not;
- splice: an event of another execution put in place of one, or inserted.

Each mutated log is verified as a SQL store would report it (its head is the last row + 1,
so nothing rests on the memory store's separate head counter). Tail truncation is tested
apart: not detected by the walk alone when the head counter goes with the rows, detected
with an exported head. A sample of every mutation kind also goes through a real store and
``AuditEventStore.verify``.

Then, on a real SQLite file, whose head is one past the last row (never below the floor
a log's creation or truncation set): a row forged at the head or past it, the floor moved
back and forward, a log's rows without their row in ``loom_logs``, and every input of
the answering classification edited (the store keeps no derived column to flip: it
derives it from kind and metadata). ``verify`` checks the store's head against the
chain, and never calls intact a log of which ``read`` returns more than it verified.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path

import pytest
from loom_audit import (
    AuditEventStore,
    ChainBroken,
    ChainHead,
    ChainWalk,
    Verification,
    find_audit_store,
    link_hash,
    read_link,
)

from loom_core import (
    Event,
    EventKind,
    FenceStale,
    InvalidInputError,
    JsonValue,
    NewEvent,
    Storage,
    open_storage,
)
from loom_core.memory import MemoryEventStore
from loom_core.spi import canonical_json

CHAINS = 50
LENGTH = 100
PER_KIND = 1100
SEED = 20261130
KINDS = ["EXECUTION_STARTED", "STEP_COMPLETED", "order.shipped", "STEP_FAILED", "ANNOTATION"]

Chain = list[Event]
Mutation = Callable[[random.Random, str, Chain, dict[str, Chain]], Chain | None]


def _payload(execution_id: str, i: int) -> JsonValue:
    tags: list[JsonValue] = ["a", "b"]
    return {"n": i, "text": f"event {i} of {execution_id}", "amount": i * 1.25,
            "tags": tags[: i % 3], "ok": i % 2 == 0, "none": None}


async def _write_chains() -> tuple[dict[str, Chain], dict[str, ChainHead]]:
    raw = MemoryEventStore()
    audit = AuditEventStore(raw)
    for c in range(CHAINS):
        execution_id = f"chain-{c:02d}"
        fence: int | None = None
        for batch in range(LENGTH // 10):
            if batch % 3 == 1:
                fence = await audit.acquire_fence(execution_id)
            await audit.append(
                execution_id,
                [NewEvent(KINDS[i % len(KINDS)], _payload(execution_id, i),
                          {"step": i, "node": f"node-{i % 3}"})
                 for i in range(batch * 10, batch * 10 + 10)],
                expected_sequence=batch * 10,
                fence=fence,
            )
    chains = {e: list(await raw.read(e)) for e in await raw.list_executions()}
    heads = {e: await audit.export_head(e) for e in chains}
    assert all([(await audit.verify(e)).ok for e in chains])
    return chains, heads


def _renumbered(execution_id: str, events: Chain) -> Chain:
    return [dataclasses.replace(e, execution_id=execution_id, sequence=i)
            for i, e in enumerate(events)]


def _walk(execution_id: str, rows: Chain, head: ChainHead | None = None,
          store_head: int | None = None) -> Verification:
    walk = ChainWalk(execution_id, head=head)
    for row in sorted(rows, key=lambda e: e.sequence):
        if walk.step(row) is not None:
            break
    if store_head is None:
        store_head = rows[-1].sequence + 1 if rows else 0
    return walk.finish(store_head)


# -- the mutations --------------------------------------------------------------------------


def flip(rng: random.Random, eid: str, chain: Chain, others: dict[str, Chain]) -> Chain | None:
    k = rng.randrange(len(chain))
    event = chain[k]
    original: JsonValue = [event.kind, event.payload, event.metadata]
    text = json.dumps(original, separators=(",", ":"), ensure_ascii=False).encode()
    for _ in range(100):
        mutated = bytearray(text)
        mutated[rng.randrange(len(mutated))] ^= 1 << rng.randrange(8)
        try:
            value = json.loads(mutated.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is one: not storable JSON text
            continue
        if (
            not isinstance(value, list) or len(value) != 3 or not isinstance(value[0], str)
            or not isinstance(value[2], dict) or value == original
        ):
            continue  # not a row, or the same value (an exponent's 'e' turned 'E')
        changed = dataclasses.replace(event, kind=value[0], payload=value[1], metadata=value[2])
        return [*chain[:k], changed, *chain[k + 1 :]]
    return None


def reorder(rng: random.Random, eid: str, chain: Chain, others: dict[str, Chain]) -> Chain:
    i = rng.randrange(len(chain) - 1)
    j = i + 1 if rng.random() < 0.5 else rng.randrange(i + 1, len(chain))
    swapped = list(chain)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    return _renumbered(eid, swapped)


def delete(rng: random.Random, eid: str, chain: Chain, others: dict[str, Chain]) -> Chain:
    k = rng.randrange(1, len(chain) - 1)
    rest = chain[:k] + chain[k + 1 :]
    return rest if rng.random() < 0.5 else _renumbered(eid, rest)  # a gap, or shifted


def _forged(rng: random.Random, eid: str, chain: Chain, k: int) -> Event:
    template = chain[k - 1]
    metadata = dict(template.metadata, forged=True)
    if rng.random() < 0.5:
        return dataclasses.replace(template, kind="FORGED", payload={"x": 1}, metadata=metadata)
    # A forger who computes a correct link over the predecessor.
    prev = read_link(template.metadata)
    assert prev is not None
    body = {k_: v for k_, v in metadata.items() if k_ != "chain"}
    own = link_hash(eid, k, "FORGED", {"x": 1}, body, prev.hash)
    metadata["chain"] = {"v": 1, "prev": prev.hash, "hash": own}
    return dataclasses.replace(template, sequence=k, kind="FORGED", payload={"x": 1},
                               metadata=metadata)


def insert(rng: random.Random, eid: str, chain: Chain, others: dict[str, Chain]) -> Chain:
    # Before position k, 1 <= k < len: a forged event appended at the very end with a
    # correct link is indistinguishable from a real one (see the docs: no secret).
    k = rng.randrange(1, len(chain))
    extra = chain[k - 1] if rng.random() < 0.3 else _forged(rng, eid, chain, k)
    rows = [*chain[:k], dataclasses.replace(extra, sequence=k), *chain[k:]]
    return _renumbered(eid, rows) if rng.random() < 0.5 else rows  # shifted, or a duplicate


def splice(rng: random.Random, eid: str, chain: Chain, others: dict[str, Chain]) -> Chain:
    donor = others[rng.choice([o for o in others if o != eid])]
    k = rng.randrange(len(chain))
    stranger = donor[k if rng.random() < 0.5 else rng.randrange(len(donor))]
    if rng.random() < 0.5:
        return _renumbered(eid, [*chain[:k], stranger, *chain[k + 1 :]])
    return _renumbered(eid, [*chain[:k], stranger, *chain[k:]])


MUTATIONS: dict[str, Mutation] = {
    "flip a byte": flip,
    "reorder": reorder,
    "delete a middle event": delete,
    "insert": insert,
    "splice from another execution": splice,
}


async def test_every_mutation_of_every_chain_is_detected() -> None:
    chains, _ = await _write_chains()
    rng = random.Random(SEED)
    ids = sorted(chains)
    tried: Counter[str] = Counter()
    detected: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for name, mutate in MUTATIONS.items():
        while tried[name] < PER_KIND:
            eid = ids[tried[name] % len(ids)]
            rows = mutate(rng, eid, chains[eid], chains)
            if rows is None:
                continue
            tried[name] += 1
            result = _walk(eid, rows)
            if not result.ok:
                detected[name] += 1
                reasons[result.reason] += 1

    total = sum(tried.values())
    figures = "; ".join(f"{k}: {detected[k]}/{tried[k]}" for k in MUTATIONS)
    print(f"\ntamper test: {sum(detected.values())}/{total} detected over {CHAINS} chains of "
          f"{LENGTH} events ({figures}); first break by reason: {dict(sorted(reasons.items()))}")
    assert total >= 5000
    assert detected == tried


async def test_tail_truncation_is_detected_with_the_exported_head() -> None:
    chains, heads = await _write_chains()
    rng = random.Random(SEED + 1)
    outcomes: Counter[str] = Counter()
    for eid, chain in chains.items():
        for cut in sorted({1, rng.randrange(2, LENGTH), LENGTH - 1}):
            kept = chain[:-cut]
            # The rows and the head counter both gone (a SQL store whose head is max + 1):
            # the walk alone cannot tell, the exported head can.
            outcomes["walk alone sees it"] += not _walk(eid, kept).ok
            with_head = _walk(eid, kept, head=heads[eid])
            assert with_head.ok is False
            assert with_head.reason == "head_truncated"
            outcomes["with the head"] += 1
            # A store that keeps its head counter apart (memory): the walk sees it.
            counter = _walk(eid, kept, store_head=LENGTH)
            assert counter.ok is False
            assert counter.reason == "tail"
            outcomes["with the store's own head counter"] += 1
            outcomes["truncations"] += 1
    print(f"\ntail truncation: {dict(outcomes)}")
    assert outcomes["walk alone sees it"] == 0
    assert outcomes["with the head"] == outcomes["truncations"] >= 100


async def _store_holding(eid: str, rows: Chain) -> AuditEventStore:
    """A fresh store whose log ``eid`` holds exactly ``rows`` (fence stamps included, each
    token acquired before the append that stamps it, as a store requires)."""
    raw = MemoryEventStore()
    token = 0

    def stamp(event: Event) -> JsonValue:
        return event.metadata.get("fence")

    for fence, group in groupby(rows, key=stamp):
        events = [NewEvent(e.kind, e.payload, {k: v for k, v in e.metadata.items()
                                                if k != "fence"}) for e in group]
        if fence is not None:
            if not isinstance(fence, int) or isinstance(fence, bool) or not (
                token <= fence <= _MAX_STAMP
            ):
                raise InvalidInputError("a fence stamp no store would write here")
            while token < fence:
                token = await raw.acquire_fence(eid)
        await raw.append(eid, events, expected_sequence=await raw.head(eid), fence=fence)
    return AuditEventStore(raw)


_MAX_STAMP = 64
"""The chains are written with a few tokens; a flip to a larger stamp is not rebuilt."""


async def test_a_sample_of_each_mutation_is_detected_through_a_real_store() -> None:
    chains, heads = await _write_chains()
    rng = random.Random(SEED + 2)
    tried = detected = 0
    for eid in sorted(chains):
        for mutate in MUTATIONS.values():
            while True:
                rows = mutate(rng, eid, chains[eid], chains)
                if rows is None:
                    continue
                rows = _renumbered(eid, rows)  # a store keeps a log gapless
                try:
                    store = await _store_holding(eid, rows)
                except InvalidInputError:
                    continue  # a flip the store's own validation refuses
                break
            tried += 1
            detected += not (await store.verify(eid)).ok
    untouched = await _store_holding("chain-00", chains["chain-00"])
    assert (await untouched.verify("chain-00", head=heads["chain-00"])).ok
    print(f"\nthrough a store: {detected}/{tried} detected")
    assert detected == tried == CHAINS * len(MUTATIONS)


# -- the head and the derived columns, on a real SQLite file --------------------------------


def test_a_walk_fed_an_event_past_the_store_head_reports_it() -> None:
    chain = [
        Event("e", i, "X", {"n": i}, {"chain": {"v": 1, "prev": prev, "hash": own}}, _EPOCH)
        for i, (prev, own) in enumerate(_links("e", 3))
    ]
    result = _walk("e", chain, store_head=2)
    assert isinstance(result, ChainBroken)
    assert (result.sequence, result.reason) == (2, "beyond_head")
    assert _walk("e", chain, store_head=3).ok


_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _links(execution_id: str, count: int) -> list[tuple[str, str]]:
    links, prev = [], "0" * 64
    for i in range(count):
        own = link_hash(execution_id, i, "X", {"n": i}, {}, prev)
        links.append((prev, own))
        prev = own
    return links


@pytest.fixture
async def on_sqlite(tmp_path: Path) -> AsyncIterator[Storage]:
    async with open_storage(f"sqlite:///{tmp_path / 'loom.db'}", decorators=["audit"]) as opened:
        yield opened


@pytest.fixture
def sql(tmp_path: Path, on_sqlite: Storage) -> Iterator[sqlite3.Connection]:
    """The attacker's connection to the same file, autocommitting."""
    connection = sqlite3.connect(tmp_path / "loom.db", isolation_level=None)
    try:
        yield connection
    finally:
        connection.close()


def _forge_after(sql: sqlite3.Connection, execution_id: str, sequence: int,
                 predecessor: Event | None) -> None:
    """Insert a row at ``sequence`` whose link is correctly computed over ``predecessor``
    (the hash is public; ``None``: no predecessor to link to), and nothing else."""
    link = None if predecessor is None else read_link(predecessor.metadata)
    prev_hash = None if link is None else link.hash
    payload: JsonValue = {"v": "FORGED"}
    own = link_hash(execution_id, sequence, "STEP_COMPLETED", payload, {}, prev_hash)
    metadata: JsonValue = {"chain": {"v": 1, "prev": prev_hash, "hash": own}}
    sql.execute(
        "INSERT INTO loom_events (execution_id, sequence, kind, payload, metadata, "
        "recorded_at) VALUES (?, ?, 'STEP_COMPLETED', ?, ?, 0)",
        (execution_id, sequence, canonical_json(payload), canonical_json(metadata)),
    )


async def _verify_agrees_with_read(storage: Storage, execution_id: str) -> Verification:
    """verify's verdict, checked against what read hands out: an intact verdict covers
    every event read returns, exactly up to head() - 1."""
    result = await find_audit_store(storage).verify(execution_id)
    shown = await storage.events.read(execution_id)
    if result.ok:
        head = await storage.events.head(execution_id)
        assert len(shown) == result.events, "read returns events verify never checked"
        assert [e.sequence for e in shown] == list(range(head - len(shown), head))
    return result


async def test_a_row_forged_past_the_head_is_never_passed_as_intact(
    on_sqlite: Storage, sql: sqlite3.Connection
) -> None:
    written = await on_sqlite.events.append(
        "e", [NewEvent("X", {"n": i}) for i in range(3)], expected_sequence=0
    )
    _forge_after(sql, "e", 8, None)
    assert await on_sqlite.events.head("e") == 9
    result = await _verify_agrees_with_read(on_sqlite, "e")
    assert isinstance(result, ChainBroken)
    assert result.sequence == 8
    assert await on_sqlite.events.read("e", to_sequence=2) == written


@pytest.mark.parametrize("linked", [False, True], ids=["wrong-link", "computed-link"])
async def test_a_row_forged_at_the_head_is_the_logs_next_event(
    on_sqlite: Storage, sql: sqlite3.Connection, linked: bool
) -> None:
    await on_sqlite.events.append(
        "e", [NewEvent("X", {"n": i}) for i in range(3)], expected_sequence=0
    )
    chained = await find_audit_store(on_sqlite).read_chained("e")
    _forge_after(sql, "e", 3, chained[-1] if linked else None)
    assert await on_sqlite.events.head("e") == 4
    result = await _verify_agrees_with_read(on_sqlite, "e")
    if linked:
        # The chain alone cannot tell a correctly linked forgery at the end from an append
        # (docs/audit.md, "not detected"); an exported head bounds what it vouches for.
        assert result.ok
    else:
        assert isinstance(result, ChainBroken)
        assert result.sequence == 3


async def test_the_floor_cannot_hide_events_and_above_them_is_a_missing_tail(
    on_sqlite: Storage, sql: sqlite3.Connection
) -> None:
    await on_sqlite.events.append("e", [NewEvent("X", {"n": i}) for i in range(3)],
                                  expected_sequence=0)
    # Appends write no floor; a truncation or a copy would.
    assert sql.execute("SELECT count(*) FROM loom_logs").fetchone() == (0,)
    sql.execute("INSERT INTO loom_logs VALUES ('e', 2)")
    assert await on_sqlite.events.head("e") == 3
    assert (await _verify_agrees_with_read(on_sqlite, "e")).ok
    # Moved forward instead, the chain ends before the head: its tail is missing.
    sql.execute("UPDATE loom_logs SET floor = 4 WHERE execution_id = 'e'")
    moved_on = await find_audit_store(on_sqlite).verify("e")
    assert isinstance(moved_on, ChainBroken)
    assert (moved_on.sequence, moved_on.reason) == (3, "tail")


async def test_rows_without_their_floor_are_still_the_log(
    on_sqlite: Storage, sql: sqlite3.Connection
) -> None:
    await on_sqlite.events.append("e", [NewEvent("X", {"n": i}) for i in range(4)],
                                  expected_sequence=0)
    await on_sqlite.events.truncate_prefix_keeping("e", keep_from_sequence=2)
    sql.execute("DELETE FROM loom_logs WHERE execution_id = 'e'")
    assert await on_sqlite.events.head("e") == 4
    result = await find_audit_store(on_sqlite).verify("e", allow_truncated_prefix=True)
    assert result.ok
    assert result.events == 2
    assert [e.sequence for e in await on_sqlite.events.read("e")] == [2, 3]


async def _park_and_answer(storage: Storage) -> int:
    events = storage.events
    token = await events.acquire_fence("p")
    await events.append(
        "p", [NewEvent(EventKind.EXECUTION_STARTED, {}),
              NewEvent(EventKind.EXECUTION_SUSPENDED, {"wait": "x"})],
        expected_sequence=0, fence=token,
    )
    await events.append("p", [NewEvent(EventKind.EXECUTION_RESUMED, {"by": "x"})],
                        expected_sequence=2, fence=token)
    return token


async def test_every_input_of_the_answering_classification_is_chained(
    on_sqlite: Storage, sql: sqlite3.Connection
) -> None:
    await _park_and_answer(on_sqlite)
    audit = find_audit_store(on_sqlite)
    edits = [
        ("UPDATE loom_events SET kind = 'STEP_COMPLETED' "
         "WHERE execution_id = 'p' AND sequence = 2"),
        ("UPDATE loom_events SET kind = 'app.done', "
         "metadata = json_set(metadata, '$.kernel', json('true')) "
         "WHERE execution_id = 'p' AND sequence = 2"),
        ("UPDATE loom_events SET metadata = json_set(metadata, '$.fence', 0) "
         "WHERE execution_id = 'p' AND sequence = 2"),
    ]
    original = sql.execute(
        "SELECT kind, metadata FROM loom_events "
        "WHERE execution_id = 'p' AND sequence = 2"
    ).fetchone()
    for edit in edits:
        sql.execute(edit)
        broken = await audit.verify("p")
        assert isinstance(broken, ChainBroken), edit
        assert (broken.sequence, broken.reason) == (2, "content")
        sql.execute(
            "UPDATE loom_events SET kind = ?, metadata = ? "
            "WHERE execution_id = 'p' AND sequence = 2", original,
        )
    assert (await audit.verify("p")).ok


async def test_no_derived_answering_column_is_left_to_flip_and_the_answer_still_wins(
    on_sqlite: Storage, sql: sqlite3.Connection
) -> None:
    token = await _park_and_answer(on_sqlite)
    columns = {row[1] for row in sql.execute("PRAGMA table_info(loom_events)")}
    assert "answering" not in columns  # nothing beside kind and metadata decides it
    # The log (kind, payload, metadata) is untouched, so the chain holds ...
    assert (await find_audit_store(on_sqlite).verify("p")).ok
    # ... and the park was answered: the conditional acquire must lose.
    assert isinstance(
        await on_sqlite.events.acquire_fence_if("p", fence=token, park_seq=1), FenceStale
    )
