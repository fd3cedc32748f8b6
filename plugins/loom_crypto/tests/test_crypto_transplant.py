"""The transplant test: a sealed payload moved to any other event is rejected, every time.

Eight executions of eight events (three subjects, four kinds) are sealed. Then, as an
attacker with write access to the database would, every ciphertext is copied over every
other event's (another sequence of the same execution, or any event of another execution,
whether the subject is the same or not), each kind is relabelled, and each envelope's key
id is pointed at another subject's key. Every one of those reads must fail with
PayloadAuthenticationError; the untouched control reads must all succeed.
"""

from __future__ import annotations

import itertools
from collections import Counter

from loom_crypto import CryptoEventStore, MemoryKeyStore, PayloadAuthenticationError

from loom_core import Event, JsonValue, NewEvent
from loom_core.memory import MemoryEventStore

EXECUTIONS = [f"{owner}/run-{n}" for owner in ("alice", "bob", "carol") for n in range(3)][:8]
KINDS = ["EXECUTION_STARTED", "STEP_COMPLETED", "order.shipped", "STEP_FAILED"]
PER_LOG = 8


def _owner(execution_id: str, event: NewEvent) -> str:
    return execution_id.split("/", 1)[0]


async def _rewrite(inner: MemoryEventStore, execution_id: str, events: list[Event],
                   at: int, payload: JsonValue, kind: str | None = None) -> None:
    """Re-create the log with event ``at`` replaced, as a row UPDATE would leave it."""
    await inner.delete_execution(execution_id)
    rows = [NewEvent(e.kind, e.payload, e.metadata) for e in events]
    rows[at] = NewEvent(kind or rows[at].kind, payload, rows[at].metadata)
    await inner.append(execution_id, rows, expected_sequence=0)


async def _rejected(store: CryptoEventStore, execution_id: str, sequence: int) -> bool:
    """Whether reading the event fails authentication, naming that very event."""
    try:
        await store.read(execution_id, from_sequence=sequence, to_sequence=sequence)
    except PayloadAuthenticationError as exc:
        return (exc.execution_id, exc.sequence) == (execution_id, sequence)
    return False


def _kid(event: Event) -> str:
    assert isinstance(event.payload, dict)
    kid = event.payload["kid"]
    assert isinstance(kid, str)
    return kid


async def test_every_transplanted_ciphertext_is_rejected() -> None:
    inner = MemoryEventStore()
    store = CryptoEventStore(inner, key_store=MemoryKeyStore(), subject_of=_owner)
    for execution_id in EXECUTIONS:
        await store.append(
            execution_id,
            [NewEvent(KINDS[i % len(KINDS)], {"who": execution_id, "i": i})
             for i in range(PER_LOG)],
            expected_sequence=0,
        )
    original = {e: list(await inner.read(e)) for e in EXECUTIONS}
    positions = [(e, s) for e in EXECUTIONS for s in range(PER_LOG)]
    tally: Counter[str] = Counter()
    rejected: Counter[str] = Counter()

    for (src, src_seq), (dst, dst_seq) in itertools.permutations(positions, 2):
        kind = "same execution" if src == dst else (
            "same subject" if src.split("/")[0] == dst.split("/")[0] else "other subject"
        )
        await _rewrite(inner, dst, original[dst], dst_seq, original[src][src_seq].payload)
        tally[kind] += 1
        rejected[kind] += await _rejected(store, dst, dst_seq)
        await _rewrite(inner, dst, original[dst], dst_seq, original[dst][dst_seq].payload)

    kids = {e: _kid(original[e][0]) for e in EXECUTIONS}
    for execution_id, sequence in positions:
        event = original[execution_id][sequence]
        other_kind = next(k for k in KINDS if k != event.kind)
        await _rewrite(inner, execution_id, original[execution_id], sequence, event.payload,
                       kind=other_kind)
        tally["kind relabelled"] += 1
        rejected["kind relabelled"] += await _rejected(store, execution_id, sequence)
        other_kid = next(k for e, k in kids.items() if k != kids[execution_id])
        assert isinstance(event.payload, dict)
        await _rewrite(inner, execution_id, original[execution_id], sequence,
                       dict(event.payload, kid=other_kid))
        tally["key id swapped"] += 1
        rejected["key id swapped"] += await _rejected(store, execution_id, sequence)
        await _rewrite(inner, execution_id, original[execution_id], sequence, event.payload)

    figures = ", ".join(f"{k}: {rejected[k]}/{tally[k]}" for k in sorted(tally))
    print(f"\ntransplant test: {sum(rejected.values())}/{sum(tally.values())} rejected ({figures})")
    assert rejected == tally
    assert sum(tally.values()) == len(positions) * (len(positions) - 1) + 2 * len(positions)
    # The control: with every log restored, every event opens.
    for execution_id in EXECUTIONS:
        assert [e.payload for e in await store.read(execution_id)] == [
            {"who": execution_id, "i": i} for i in range(PER_LOG)
        ]
