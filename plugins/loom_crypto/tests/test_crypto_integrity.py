"""Sealed means authenticated: the decorator hands back only payloads it wrote, for that
event, in that incarnation of the log (see docs/design.md, "Sealed means authenticated, for
this incarnation of the log").

Every test tampers with a real SQLite file through ``sqlite3``, as someone with write access
to the database (and none to the key store) would: a payload replaced with plaintext, a
clear payload edited, a row saved before ``delete_execution`` written back after the id was
re-created (the payload alone, or the whole row), after a compaction, and on a shredded log.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import subject_prefix
from loom_crypto import (
    INCARNATION_FIELD,
    INTEGRITY_SUBJECT,
    FileKeyStore,
    IncarnationMismatchError,
    PayloadAuthenticationError,
    UnauthenticatedPayloadError,
    find_crypto_store,
    shred_subject,
)

from loom_core import (
    InvalidEventError,
    InvalidOptionError,
    NewEvent,
    PayloadShreddedError,
    Storage,
    open_storage,
)

FORGED = '{"v":"FORGED"}'


@pytest.fixture
def database_path(tmp_path: Path) -> Path:
    return tmp_path / "loom.db"


@pytest.fixture
async def storage(database_path: Path, tmp_path: Path) -> AsyncIterator[Storage]:
    crypto = ("crypto", {"key_store": FileKeyStore(tmp_path / "keys"),
                         "subject_of": subject_prefix})
    async with open_storage(f"sqlite:///{database_path}", decorators=[crypto]) as opened:
        yield opened


@pytest.fixture
def sql(database_path: Path, storage: Storage) -> Iterator[sqlite3.Connection]:
    """A second connection to the same file, autocommitting: the attacker's."""
    connection = sqlite3.connect(database_path, isolation_level=None)
    try:
        yield connection
    finally:
        connection.close()


def _row(sql: sqlite3.Connection, execution_id: str, sequence: int) -> tuple[str, str]:
    payload, metadata = sql.execute(
        "SELECT payload, metadata FROM loom_events WHERE execution_id = ? AND sequence = ?",
        (execution_id, sequence),
    ).fetchone()
    return str(payload), str(metadata)


def _set(sql: sqlite3.Connection, execution_id: str, sequence: int, payload: str,
         metadata: str | None = None) -> None:
    if metadata is None:
        sql.execute(
            "UPDATE loom_events SET payload = ? WHERE execution_id = ? AND sequence = ?",
            (payload, execution_id, sequence),
        )
    else:
        sql.execute(
            "UPDATE loom_events SET payload = ?, metadata = ? "
            "WHERE execution_id = ? AND sequence = ?",
            (payload, metadata, execution_id, sequence),
        )


# -- forgery: a payload the decorator did not write ----------------------------------------


@pytest.mark.parametrize("execution_id", ["alice/1", "public/1"], ids=["sealed", "clear"])
async def test_a_payload_replaced_with_plaintext_is_refused(
    storage: Storage, sql: sqlite3.Connection, execution_id: str
) -> None:
    await storage.events.append(
        execution_id, [NewEvent("X", {"v": "genuine"}), NewEvent("Y", {"n": 1})],
        expected_sequence=0,
    )
    _set(sql, execution_id, 0, FORGED)
    with pytest.raises(PayloadAuthenticationError) as caught:
        await storage.events.read(execution_id)
    assert isinstance(caught.value, UnauthenticatedPayloadError)
    assert (caught.value.execution_id, caught.value.sequence) == (execution_id, 0)
    with pytest.raises(UnauthenticatedPayloadError):
        await storage.events.read(execution_id, from_sequence=0, to_sequence=0)
    # The untouched event still reads on its own.
    assert (await storage.events.read(execution_id, from_sequence=1))[0].payload == {"n": 1}


async def test_an_edited_clear_payload_is_refused(
    storage: Storage, sql: sqlite3.Connection
) -> None:
    await storage.events.append("public/1", [NewEvent("X", {"amount": 10})],
                                expected_sequence=0)
    payload, _ = _row(sql, "public/1", 0)
    envelope = json.loads(payload)
    assert json.loads(envelope["json"]) == {"amount": 10}  # readable in the database
    envelope["json"] = '{"amount":1000}'
    _set(sql, "public/1", 0, json.dumps(envelope))
    with pytest.raises(PayloadAuthenticationError, match="MAC does not match"):
        await storage.events.read("public/1")


async def test_a_clear_payload_moved_to_another_event_is_refused(
    storage: Storage, sql: sqlite3.Connection
) -> None:
    await storage.events.append("public/1", [NewEvent("X", "a"), NewEvent("X", "b")],
                                expected_sequence=0)
    await storage.events.append("public/2", [NewEvent("X", "c")], expected_sequence=0)
    first, _ = _row(sql, "public/1", 0)
    _set(sql, "public/1", 1, first)
    with pytest.raises(PayloadAuthenticationError):
        await storage.events.read("public/1", from_sequence=1)
    _set(sql, "public/2", 0, first)
    with pytest.raises(PayloadAuthenticationError):
        await storage.events.read("public/2")


# -- transplant: a row of a deleted incarnation --------------------------------------------


@pytest.mark.parametrize("execution_id", ["alice/1", "public/1"], ids=["sealed", "clear"])
async def test_a_payload_saved_before_delete_does_not_open_in_the_recreated_log(
    storage: Storage, sql: sqlite3.Connection, execution_id: str
) -> None:
    await storage.events.append(execution_id, [NewEvent("X", {"v": "old"})],
                                expected_sequence=0)
    saved, _ = _row(sql, execution_id, 0)
    assert await storage.events.delete_execution(execution_id) is True
    await storage.events.append(execution_id, [NewEvent("X", {"v": "new"})],
                                expected_sequence=0)

    _set(sql, execution_id, 0, saved)  # the payload column alone, as a tamperer's UPDATE would
    with pytest.raises(PayloadAuthenticationError) as caught:
        await storage.events.read(execution_id)
    assert (caught.value.execution_id, caught.value.sequence) == (execution_id, 0)


@pytest.mark.parametrize("execution_id", ["alice/1", "public/1"], ids=["sealed", "clear"])
async def test_a_whole_row_saved_before_delete_is_refused_in_the_recreated_log(
    storage: Storage, sql: sqlite3.Connection, execution_id: str
) -> None:
    await storage.events.append(
        execution_id, [NewEvent("X", {"v": f"old {i}"}) for i in range(3)],
        expected_sequence=0,
    )
    saved = [_row(sql, execution_id, s) for s in range(3)]
    await storage.events.delete_execution(execution_id)
    await storage.events.append(
        execution_id, [NewEvent("X", {"v": f"new {i}"}) for i in range(3)],
        expected_sequence=0,
    )

    for sequence in (0, 1, 2):
        original = _row(sql, execution_id, sequence)
        _set(sql, execution_id, sequence, *saved[sequence])  # payload and metadata
        with pytest.raises(IncarnationMismatchError) as caught:
            await storage.events.read(execution_id)
        assert caught.value.expected != caught.value.found
        if sequence > 0:
            # A read of the copied row alone is checked against the log's first event.
            with pytest.raises(IncarnationMismatchError):
                await storage.events.read(execution_id, from_sequence=sequence,
                                          to_sequence=sequence)
        _set(sql, execution_id, sequence, *original)
    assert [e.payload for e in await storage.events.read(execution_id)] == [
        {"v": f"new {i}"} for i in range(3)
    ]


async def test_a_compacted_log_still_knows_its_incarnation(
    storage: Storage, sql: sqlite3.Connection
) -> None:
    await storage.events.append("alice/1", [NewEvent("X", {"v": f"old {i}"}) for i in range(4)],
                                expected_sequence=0)
    saved = [_row(sql, "alice/1", s) for s in range(4)]
    await storage.events.delete_execution("alice/1")
    await storage.events.append("alice/1", [NewEvent("X", {"v": f"new {i}"}) for i in range(4)],
                                expected_sequence=0)
    assert await storage.events.truncate_prefix_keeping("alice/1", keep_from_sequence=2) == 2
    # Sequence 0 is gone; appends continue the incarnation of the first kept event.
    await storage.events.append("alice/1", [NewEvent("X", {"v": "new 4"})], expected_sequence=4)
    assert [e.payload for e in await storage.events.read("alice/1", from_sequence=3)] == [
        {"v": "new 3"}, {"v": "new 4"}
    ]
    _set(sql, "alice/1", 3, *saved[3])
    with pytest.raises(IncarnationMismatchError):
        await storage.events.read("alice/1")
    with pytest.raises(IncarnationMismatchError):
        await storage.events.read("alice/1", from_sequence=3, to_sequence=3)
    _set(sql, "alice/1", 3, saved[3][0])  # the old payload under the new row's metadata
    with pytest.raises(PayloadAuthenticationError):
        await storage.events.read("alice/1", from_sequence=3, to_sequence=3)


async def test_an_event_stripped_of_its_incarnation_is_refused(
    storage: Storage, sql: sqlite3.Connection, database_path: Path, tmp_path: Path
) -> None:
    await storage.events.append("alice/1", [NewEvent("X", 1), NewEvent("X", 2)],
                                expected_sequence=0)
    payload, metadata = _row(sql, "alice/1", 1)
    stripped = json.dumps({k: v for k, v in json.loads(metadata).items()
                           if k != INCARNATION_FIELD})
    _set(sql, "alice/1", 1, payload, stripped)
    with pytest.raises(IncarnationMismatchError) as caught:
        await storage.events.read("alice/1")
    assert caught.value.found is None
    _set(sql, "alice/1", 1, payload, metadata)
    assert [e.payload for e in await storage.events.read("alice/1")] == [1, 2]
    # Stripped from the first event, the log reads as one written by 0.1: refused.
    payload0, metadata0 = _row(sql, "alice/1", 0)
    _set(sql, "alice/1", 0, payload0, json.dumps(
        {k: v for k, v in json.loads(metadata0).items() if k != INCARNATION_FIELD}))
    with pytest.raises(UnauthenticatedPayloadError, match="legacy_reads=True"):
        await storage.events.read("alice/1", from_sequence=1)
    # A process that does not remember the log's incarnation reads the stripped first
    # event to find it, and is refused; nothing is written.
    crypto = ("crypto", {"key_store": FileKeyStore(tmp_path / "keys"),
                         "subject_of": subject_prefix})
    async with open_storage(f"sqlite:///{database_path}", decorators=[crypto]) as other:
        with pytest.raises(UnauthenticatedPayloadError):
            await other.events.append("alice/1", [NewEvent("X", 3)], expected_sequence=2)
    assert await storage.events.head("alice/1") == 2
    # The writer that created the log remembers its incarnation and goes on in it (under
    # the token it remembers, so only in that very log): the new event is genuine, and
    # the log still reads as tampered until its first event is put back.
    await storage.events.append("alice/1", [NewEvent("X", 3)], expected_sequence=2)
    with pytest.raises(UnauthenticatedPayloadError):
        await storage.events.read("alice/1", from_sequence=1)
    _set(sql, "alice/1", 0, payload0, metadata0)
    assert [e.payload for e in await storage.events.read("alice/1")] == [1, 2, 3]


# -- shredding and the reserved names ------------------------------------------------------


async def test_a_shredded_log_keeps_its_markers_authenticated(
    storage: Storage, sql: sqlite3.Connection
) -> None:
    await storage.events.append("alice/1", [NewEvent("X", {"card": "4111"})],
                                expected_sequence=0)
    await storage.events.append("alice/1", [NewEvent("Y", {"n": 1})], expected_sequence=1)
    result = await shred_subject(storage, "alice")
    assert result.executions == ("alice/1",)
    with pytest.raises(PayloadShreddedError):
        await storage.events.read("alice/1")
    markers = await storage.events.read("alice/1", from_sequence=2)
    assert [(e.kind, e.payload) for e in markers] == [
        ("ERASURE_PENDING", {"kid": result.key_id}),
        ("PAYLOAD_SHREDDED", {"kid": result.key_id}),
    ]
    assert all(e.metadata == {} for e in markers)
    _set(sql, "alice/1", 3, json.dumps({"kid": "someone-else"}))
    with pytest.raises(UnauthenticatedPayloadError):
        await storage.events.read("alice/1", from_sequence=3)


async def test_the_reserved_names_are_refused_before_anything_is_written(
    storage: Storage,
) -> None:
    events = storage.events
    with pytest.raises(InvalidEventError, match=r"\$loom_incarnation"):
        await events.append("alice/r", [NewEvent("X", 1, {INCARNATION_FIELD: "mine"})],
                            expected_sequence=0)
    with pytest.raises(InvalidEventError, match=r"\$loom_clear"):
        await events.append("alice/r", [NewEvent("X", {"$loom_clear": 2})],
                            expected_sequence=0)
    assert await events.head("alice/r") == 0
    with pytest.raises(InvalidOptionError, match="reserved subject"):
        await shred_subject(storage, INTEGRITY_SUBJECT)
    crypto = find_crypto_store(storage)
    rogue = type(crypto)(crypto.inner, key_store=crypto.key_store,
                         subject_of=lambda eid, ev: INTEGRITY_SUBJECT)
    with pytest.raises(InvalidOptionError, match="reserved subject"):
        await rogue.append("alice/r", [NewEvent("X", 1)], expected_sequence=0)
    assert await events.head("alice/r") == 0


async def test_a_subscription_refuses_events_of_a_recreated_log(storage: Storage) -> None:
    events = storage.events
    await events.append("alice/s", [NewEvent("X", 0)], expected_sequence=0)
    stream = events.subscribe("alice/s", from_sequence=0)
    try:
        assert (await anext(stream)).payload == 0
        await events.append("alice/s", [NewEvent("X", 1)], expected_sequence=1)
        assert (await anext(stream)).payload == 1
        await events.delete_execution("alice/s")
        await events.append("alice/s", [NewEvent("X", "a"), NewEvent("X", "b"),
                                        NewEvent("X", "c")], expected_sequence=0)
        with pytest.raises(IncarnationMismatchError):
            await anext(stream)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
