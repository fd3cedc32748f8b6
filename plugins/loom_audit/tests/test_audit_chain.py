"""The audit chain through the decorator: links, verification, heads, concurrency, and what
truncation, deletion and copying mean for a chain."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random

import pytest
from loom_audit import (
    CHAIN_FIELD,
    GENESIS,
    AuditEventStore,
    ChainBroken,
    ChainHead,
    ChainIntact,
    NoHeadError,
    link_hash,
    read_link,
)
from loom_audit.chain import _FLOAT_SHAPE, _float_shaped

from loom_core import (
    AppendRequest,
    ConflictError,
    Event,
    ExecutionNotFoundError,
    FenceNotIssuedError,
    InvalidEventError,
    InvalidInputError,
    InvalidOptionError,
    JsonObject,
    JsonValue,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    Unsupported,
)
from loom_core.memory import MemoryEventStore
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS


@pytest.fixture
def raw() -> MemoryEventStore:
    return MemoryEventStore()


@pytest.fixture
def audit(raw: MemoryEventStore) -> AuditEventStore:
    return AuditEventStore(raw)


def _link(event: Event) -> tuple[str | None, str]:
    link = read_link(event.metadata)
    assert link is not None
    return link.prev, link.hash


async def _rewrite(raw: MemoryEventStore, execution_id: str, rows: list[NewEvent]) -> None:
    """Replace a log wholesale, as someone with write access to the database could."""
    await raw.delete_execution(execution_id)
    await raw.append(execution_id, rows, expected_sequence=0)


async def test_each_event_links_to_its_predecessor(audit: AuditEventStore) -> None:
    await audit.append("e", [NewEvent("A", 1), NewEvent("B", 2)], expected_sequence=0)
    await audit.append("e", [NewEvent("C", {"x": [1.5, None]})], expected_sequence=2)
    events = await audit.read_chained("e")
    links = [_link(e) for e in events]
    assert links[0][0] == GENESIS
    assert [prev for prev, _ in links[1:]] == [own for _, own in links[:-1]]
    assert len({own for _, own in links}) == 3
    result = await audit.verify("e")
    assert result == ChainIntact("e", events=3, first_sequence=0, last_sequence=2,
                                 anchored_at_genesis=True, head_checked=False)


async def test_user_metadata_is_kept_and_the_chain_key_is_reserved(
    audit: AuditEventStore,
) -> None:
    await audit.append("e", [NewEvent("A", 1, {"by": "node-1"})], expected_sequence=0)
    (event,) = await audit.read("e")
    assert event.metadata == {"by": "node-1"}  # the link is kept out of the caller's view
    (stored,) = await audit.read_chained("e")
    assert stored.metadata["by"] == "node-1"
    assert _link(stored)[0] == GENESIS
    with pytest.raises(InvalidEventError, match="reserved key 'chain'"):
        await audit.append("e", [NewEvent("B", 2, {CHAIN_FIELD: "x"})], expected_sequence=1)
    with pytest.raises(InvalidEventError, match="reserved key 'chain'"):
        await audit.append_many([AppendRequest("f", [NewEvent("B", 2, {CHAIN_FIELD: 1})], 0)])
    assert await audit.head("e") == 1
    assert await audit.head("f") == 0


async def test_the_fence_stamp_is_covered(audit: AuditEventStore, raw: MemoryEventStore) -> None:
    token = await audit.acquire_fence("e")
    await audit.append("e", [NewEvent("A", 1), NewEvent("B", 2)], expected_sequence=0, fence=token)
    assert (await audit.verify("e")).ok
    rows = [NewEvent(e.kind, e.payload, {k: v for k, v in e.metadata.items() if k != "fence"})
            for e in await raw.read("e")]
    # The same events rewritten unfenced: only the stamp differs.
    await _rewrite(raw, "e", rows)
    result = await audit.verify("e")
    assert isinstance(result, ChainBroken)
    assert (result.sequence, result.reason) == (0, "content")


async def test_append_many_and_append_if_unchanged_are_chained(audit: AuditEventStore) -> None:
    await audit.append("a", [NewEvent("A", 0)], expected_sequence=0)
    await audit.append_many(
        [AppendRequest("a", [NewEvent("A", 1)], 1), AppendRequest("b", [NewEvent("B", 0)], 0)]
    )
    await audit.append_if_unchanged("b", [NewEvent("B", 1)], expected_sequence=1,
                                    observed_fence=0)
    for execution_id in ("a", "b"):
        assert await audit.verify(execution_id) == ChainIntact(
            execution_id, 2, 0, 1, anchored_at_genesis=True, head_checked=False
        )


async def test_an_append_at_a_wrong_sequence_is_refused_and_writes_nothing(
    audit: AuditEventStore,
) -> None:
    await audit.append("e", [NewEvent("A")], expected_sequence=0)
    with pytest.raises(SequenceConflictError) as caught:
        await audit.append("e", [NewEvent("B")], expected_sequence=3)
    assert caught.value.actual_head == 1
    assert await audit.head("e") == 1


@pytest.mark.parametrize(
    ("observed", "refused"), [(1, StaleFenceError), (0, SequenceConflictError)]
)
async def test_an_append_if_unchanged_past_the_head_is_refused_as_the_store_refuses_it(
    raw: MemoryEventStore, audit: AuditEventStore, observed: int,
    refused: type[ConflictError],
) -> None:
    # The store below checks the observed token before the sequence: a stale token is what
    # the caller hears, though there is no predecessor to link to either.
    await audit.append("e", [NewEvent("A")], expected_sequence=0)
    for store in (raw, audit):
        with pytest.raises(refused) as caught:
            await store.append_if_unchanged(
                "e", [NewEvent("B")], expected_sequence=3, observed_fence=observed
            )
        if refused is StaleFenceError:
            assert vars(caught.value) == {
                "execution_id": "e", "presented_fence": 1, "current_fence": 0,
            }
        else:
            assert vars(caught.value) == {
                "execution_id": "e", "expected_sequence": 3, "actual_head": 1,
            }
    assert await raw.head("e") == 1


async def test_an_append_many_is_refused_for_its_first_refused_request_as_the_store_does(
    raw: MemoryEventStore, audit: AuditEventStore
) -> None:
    # The first request presents a token never issued; the second is past its head, with
    # no predecessor to link to. The store below refuses the first (requests in order):
    # so must the audit decorator, though it cannot link the second.
    await audit.append("a", [NewEvent("A")], expected_sequence=0)
    requests = [
        AppendRequest("b", [NewEvent("B")], expected_sequence=0, fence=1),
        AppendRequest("a", [NewEvent("A")], expected_sequence=2),
    ]
    for store in (raw, audit):
        with pytest.raises(FenceNotIssuedError) as caught:
            await store.append_many(requests)
        assert vars(caught.value) == {
            "execution_id": "b", "presented_fence": 1, "current_fence": 0,
        }
    with pytest.raises(SequenceConflictError) as conflict:
        await audit.append_many(requests[1:])
    assert vars(conflict.value) == {"execution_id": "a", "expected_sequence": 2, "actual_head": 1}
    assert (await raw.head("a"), await raw.head("b")) == (1, 0)


async def test_concurrent_writers_link_to_the_actual_predecessor(raw: MemoryEventStore) -> None:
    # Two "processes": two decorators over one store, eight writers each, every writer
    # retrying from the head it is told on a conflict.
    nodes = [AuditEventStore(raw), AuditEventStore(raw)]
    conflicts = 0

    async def writer(node: AuditEventStore, name: str) -> None:
        nonlocal conflicts
        for i in range(10):
            while True:
                head = await node.head("shared")
                try:
                    await node.append("shared", [NewEvent("W", {"w": name, "i": i})],
                                      expected_sequence=head)
                    break
                except ConflictError:  # a moved head, or a lost race to create the log
                    conflicts += 1
                    await asyncio.sleep(random.random() / 1000)

    await asyncio.gather(*(writer(nodes[n % 2], f"w{n}") for n in range(16)))
    events = await raw.read("shared")
    assert len(events) == 160
    assert conflicts > 0  # the writers really raced
    for before, after in itertools.pairwise(events):
        assert _link(after)[0] == _link(before)[1]
    assert (await nodes[0].verify("shared")).ok


async def test_a_log_written_around_the_decorator_has_a_missing_link(
    audit: AuditEventStore, raw: MemoryEventStore
) -> None:
    await audit.append("e", [NewEvent("A")], expected_sequence=0)
    await raw.append("e", [NewEvent("SNEAKED")], expected_sequence=1)
    result = await audit.verify("e")
    assert isinstance(result, ChainBroken)
    assert (result.sequence, result.reason) == (1, "missing_link")


async def test_verifying_an_unknown_execution_is_not_found(audit: AuditEventStore) -> None:
    with pytest.raises(ExecutionNotFoundError):
        await audit.verify("nope")
    with pytest.raises(ExecutionNotFoundError):
        await audit.export_head("nope")


async def test_integral_floats_verify_whichever_way_the_store_returns_them(
    audit: AuditEventStore, raw: MemoryEventStore
) -> None:
    await audit.append("e", [NewEvent("A", {"amount": 1.0, "big": 1e20})], expected_sequence=0)
    (event,) = await raw.read("e")
    # A jsonb store hands integral numbers back as integers.
    await _rewrite(raw, "e", [NewEvent("A", {"amount": 1, "big": 10**20}, event.metadata)])
    assert (await audit.verify("e")).ok


# -- heads ------------------------------------------------------------------------------------


async def test_a_head_detects_a_truncated_tail_that_the_walk_alone_cannot(
    audit: AuditEventStore, raw: MemoryEventStore
) -> None:
    await audit.append("e", [NewEvent("A", i) for i in range(5)], expected_sequence=0)
    head = await audit.export_head("e")
    assert (head.execution_id, head.sequence, head.signature) == ("e", 4, None)
    assert await audit.verify("e", head=head) == ChainIntact(
        "e", 5, 0, 4, anchored_at_genesis=True, head_checked=True
    )
    kept = [NewEvent(e.kind, e.payload, e.metadata) for e in (await raw.read("e"))[:3]]
    await _rewrite(raw, "e", kept)  # the last two events and the head counter are gone
    assert (await audit.verify("e")).ok
    result = await audit.verify("e", head=head)
    assert isinstance(result, ChainBroken)
    assert (result.sequence, result.reason) == (4, "head_truncated")


async def test_a_head_detects_a_rewrite_with_every_hash_recomputed(
    audit: AuditEventStore, raw: MemoryEventStore
) -> None:
    await audit.append("e", [NewEvent("A", i) for i in range(5)], expected_sequence=0)
    head = await audit.export_head("e")
    # Someone rewrites event 1 and re-chains everything through the decorator itself.
    forged = [NewEvent("A", 100 if i == 1 else i) for i in range(5)]
    await raw.delete_execution("e")
    await audit.append("e", forged, expected_sequence=0)
    assert (await audit.verify("e")).ok
    result = await audit.verify("e", head=head)
    assert isinstance(result, ChainBroken)
    assert (result.sequence, result.reason) == (4, "head_mismatch")


async def test_a_signed_head_must_carry_a_valid_signature(raw: MemoryEventStore) -> None:
    signer = AuditEventStore(raw, head_key=b"k" * 32)
    await signer.append("e", [NewEvent("A")], expected_sequence=0)
    head = await signer.export_head("e")
    assert head.signature is not None
    assert (await signer.verify("e", head=head)).ok
    for forged in (
        ChainHead("e", head.sequence, head.hash, None),
        ChainHead("e", head.sequence, head.hash, "0" * 64),
        ChainHead.from_json(dict(head.to_json(), signature=None)),
    ):
        result = await signer.verify("e", head=forged)
        assert isinstance(result, ChainBroken)
        assert result.reason == "head_signature"
    other_key = AuditEventStore(raw, head_key=b"x" * 32)
    assert not (await other_key.verify("e", head=head)).ok


async def test_a_head_round_trips_through_json_and_bad_ones_are_refused(
    audit: AuditEventStore,
) -> None:
    await audit.append("e", [NewEvent("A")], expected_sequence=0)
    head = await audit.export_head("e")
    assert ChainHead.from_json(head.to_json()) == head
    with pytest.raises(InvalidInputError):
        ChainHead.from_json({"execution_id": "e", "sequence": 0, "hash": "zz", "signature": None})
    for field in ("hash", "signature"):  # "$" would let one trailing newline through
        with pytest.raises(InvalidInputError, match=f"chain head's {field}"):
            ChainHead.from_json(dict(head.to_json(), **{field: "a" * 64 + "\n"}))
    with pytest.raises(InvalidInputError, match="exported for 'other'"):
        await audit.verify("e", head=ChainHead("other", 0, head.hash))


def test_a_short_head_key_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="at least 16"):
        AuditEventStore(MemoryEventStore(), head_key=b"short")


# -- truncation, deletion, copying -------------------------------------------------------------


async def test_a_compacted_log_verifies_only_when_declared_and_keeps_its_anchor(
    audit: AuditEventStore,
) -> None:
    await audit.append("e", [NewEvent("A", i) for i in range(6)], expected_sequence=0)
    before = await audit.read_chained("e")
    assert await audit.truncate_prefix_keeping("e", keep_from_sequence=3) == 3
    strict = await audit.verify("e")
    assert isinstance(strict, ChainBroken)
    assert (strict.sequence, strict.reason) == (3, "truncated_prefix")
    compacted = await audit.verify("e", allow_truncated_prefix=True)
    assert compacted == ChainIntact("e", 3, 3, 5, anchored_at_genesis=False, head_checked=False)
    # The anchor is the first kept event's prev: the hash of the dropped event 2.
    assert _link((await audit.read_chained("e"))[0])[0] == _link(before[2])[1]
    await audit.append("e", [NewEvent("A", 6)], expected_sequence=6)
    assert (await audit.verify("e", allow_truncated_prefix=True)).ok


async def test_a_fully_compacted_log_restarts_its_chain_from_null(audit: AuditEventStore) -> None:
    await audit.append("e", [NewEvent("A", i) for i in range(3)], expected_sequence=0)
    old_head = await audit.export_head("e")
    await audit.truncate_prefix_keeping("e", keep_from_sequence=3)
    with pytest.raises(NoHeadError):
        await audit.export_head("e")
    assert not (await audit.verify("e")).ok
    assert (await audit.verify("e", allow_truncated_prefix=True)).ok
    await audit.append("e", [NewEvent("A", 3)], expected_sequence=3)
    (event,) = await audit.read_chained("e")
    assert _link(event)[0] is None
    assert (await audit.verify("e", allow_truncated_prefix=True)).ok
    stale = await audit.verify("e", head=old_head, allow_truncated_prefix=True)
    assert isinstance(stale, ChainBroken)
    assert stale.reason == "head_not_covered"


async def test_a_deleted_log_fails_its_old_head_and_a_new_one_starts_at_genesis(
    audit: AuditEventStore,
) -> None:
    await audit.append("e", [NewEvent("A", i) for i in range(3)], expected_sequence=0)
    head = await audit.export_head("e")
    assert await audit.delete_execution("e")
    gone = await audit.verify("e", head=head)
    assert isinstance(gone, ChainBroken)
    assert gone.reason == "head_truncated"
    await audit.append("e", [NewEvent("B")], expected_sequence=0)
    (event,) = await audit.read_chained("e")
    assert _link(event)[0] == GENESIS
    assert (await audit.verify("e")).ok


async def test_copy_prefix_is_refused_and_the_rest_follows_the_inner_store() -> None:
    full, bare = AuditEventStore(MemoryEventStore()), AuditEventStore(MemoryEventStore(offer=()))
    assert full.capabilities == set(OPTIONAL_EVENT_STORE_METHODS) - {"copy_prefix"}
    assert bare.capabilities == frozenset()
    with pytest.raises(Unsupported, match="hashes its execution id"):
        await full.copy_prefix("a", "b", through_sequence=0)
    with pytest.raises(Unsupported):
        await bare.append_many([AppendRequest("a", [NewEvent("X")], 0)])
    with pytest.raises(Unsupported):
        bare.subscribe("a")


async def test_reads_and_subscriptions_show_the_callers_metadata_only(
    audit: AuditEventStore,
) -> None:
    written = await audit.append("e", [NewEvent("A", 1, {"trace": "t"})], expected_sequence=0)
    assert written[0].metadata == {"trace": "t"}
    stream = audit.subscribe("e")
    assert (await anext(stream)).metadata == {"trace": "t"}
    await audit.append_many([AppendRequest("e", [NewEvent("B")], 1)])
    assert (await anext(stream)).metadata == {}
    await stream.aclose()  # type: ignore[attr-defined]
    (changed,) = await audit.append_if_unchanged("e", [NewEvent("C")], expected_sequence=2,
                                                 observed_fence=0)
    assert changed.metadata == {}
    assert [read_link(e.metadata) is not None for e in await audit.read_chained("e")] == [
        True, True, True
    ]


def _documented_hash(
    execution_id: str, sequence: int, kind: str, payload: object,
    metadata: dict[str, object], prev: str | None,
) -> str:
    """The link hash exactly as the format documents it, with the reference encoder."""

    def normalized(value: object) -> object:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, list):
            return [normalized(v) for v in value]
        if isinstance(value, dict):
            return {k: normalized(v) for k, v in value.items()}
        return value

    text = json.dumps(
        normalized(["loom-audit", 1, execution_id, sequence, kind, payload, metadata, prev]),
        separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_AWKWARD_TEXT = "".join(chr(c) for c in range(0x20)) + '"\\/\x7f\u2028\u2029é€😀\ufeff'
_CANONICAL_CASES: list[object] = [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 10**40,
    1.0, -0.0, 1e20, 1.5, 0.1, 1e-7, 1e16, 123456.789, "", "null", "1.5", "v1e5", "plain",
    _AWKWARD_TEXT, [_AWKWARD_TEXT, [1, [2, [3]]]],
    {"b": 1, "a": 2, "é": 3, "z": 4, "😀": 5, "\uffff": 6, "A": 7, "": 8},
    {"nested": {"y": [1, 2.0, {"x": None}], "x": "t"}, "list": [{"b": 0, "a": 1}]},
    {_AWKWARD_TEXT: _AWKWARD_TEXT},
]


@pytest.mark.parametrize("payload", _CANONICAL_CASES, ids=range(len(_CANONICAL_CASES)))
def test_link_hashes_follow_the_documented_canonical_json(payload: object) -> None:
    metadata: dict[str, object] = {"fence": 3, "trace": payload, "chain": "left out"}
    covered = {k: v for k, v in metadata.items() if k != "chain"}
    for eid, kind, prev in [("e", "X", GENESIS), ("order-1.5", "K\u00e9", None)]:
        assert link_hash(eid, 7, kind, payload, metadata, prev) == _documented_hash(  # type: ignore[arg-type]
            eid, 7, kind, payload, covered, prev
        )


def test_a_link_over_metadata_without_a_chain_field_hashes_the_same() -> None:
    payload: JsonValue = {"n": 1.5, "s": "one"}
    cases: list[JsonObject] = [{"fence": 2}, {}, {"fence": 2, "chain": {"v": 2}}]
    for metadata in cases:
        covered: dict[str, object] = {k: v for k, v in metadata.items() if k != "chain"}
        before = json.dumps(metadata)
        assert link_hash("e-1", 3, "K", payload, metadata, GENESIS) == _documented_hash(
            "e-1", 3, "K", payload, covered, GENESIS
        )
        assert json.dumps(metadata) == before  # read, never changed


def test_an_address_orjson_refuses_is_refused_as_the_reference_encoder_refuses() -> None:
    # A lone surrogate cannot be UTF-8: neither encoder writes it, with or without the
    # one-call shortcut for the execution id, sequence and kind.
    for execution_id, kind in [("e-\ud800", "K"), ("e", "K\udfff")]:
        with pytest.raises(UnicodeEncodeError):
            link_hash(execution_id, 0, kind, None, {}, GENESIS)


def test_the_float_check_finds_exactly_what_the_pattern_finds() -> None:
    """Every text of up to four characters over the characters the pattern looks at (and
    one it does not), and the encoded canonical cases."""
    alphabet = b'09.eEnul"x'
    texts = [
        bytes(chars)
        for size in range(5)
        for chars in itertools.product(alphabet, repeat=size)
    ]
    texts += [json.dumps(case).encode() for case in _CANONICAL_CASES]
    for text in texts:
        assert _float_shaped(text) is (_FLOAT_SHAPE.search(text) is not None), text


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), [1, {"x": -float("inf")}]])
def test_a_nan_or_an_infinity_has_no_link_hash(bad: object) -> None:
    # Never hashed as the null orjson would write for it: a NaN read back from a tampered
    # row must not match the hash of a null.
    with pytest.raises(ValueError, match="Out of range float"):
        link_hash("e", 0, "X", bad, {}, GENESIS)  # type: ignore[arg-type]
