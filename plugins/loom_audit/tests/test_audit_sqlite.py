"""The audit chain over SQLite: rows edited with SQL behind the store's back are caught."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from loom_audit import ChainBroken, find_audit_store

from loom_core import NewEvent, Storage, open_storage

Edit = Callable[[sqlite3.Connection, str], None]


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'loom.db'}"


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Storage]:
    async with open_storage(_url(tmp_path), decorators=["audit"]) as opened:
        yield opened


def _flip_payload_byte(db: sqlite3.Connection, eid: str) -> None:
    (payload,) = db.execute(
        "SELECT payload FROM loom_events WHERE execution_id = ? AND sequence = 4", (eid,)
    ).fetchone()
    db.execute("UPDATE loom_events SET payload = ? WHERE execution_id = ? AND sequence = 4",
               (payload.replace('"n":4', '"n":5'), eid))


def _swap_sequences(db: sqlite3.Connection, eid: str) -> None:
    for old, new in ((3, -1), (6, 3), (-1, 6)):
        db.execute("UPDATE loom_events SET sequence = ? WHERE execution_id = ? AND sequence = ?",
                   (new, eid, old))


def _delete_middle(db: sqlite3.Connection, eid: str) -> None:
    db.execute("DELETE FROM loom_events WHERE execution_id = ? AND sequence = 5", (eid,))


def _splice(db: sqlite3.Connection, eid: str) -> None:
    other = "chain-b" if eid == "chain-a" else "chain-a"
    db.execute(
        "UPDATE loom_events SET (kind, payload, metadata) = (SELECT kind, payload, metadata "
        "FROM loom_events WHERE execution_id = ? AND sequence = 2) "
        "WHERE execution_id = ? AND sequence = 2",
        (other, eid),
    )


EDITS: dict[str, tuple[Edit, str]] = {
    "flip a byte": (_flip_payload_byte, "content"),
    "reorder": (_swap_sequences, "link"),
    "delete a middle event": (_delete_middle, "sequence"),
    "splice from another execution": (_splice, "link"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
async def test_rows_edited_with_sql_are_caught(
    storage: Storage, tmp_path: Path, edit: str
) -> None:
    for eid in ("chain-a", "chain-b"):
        await storage.events.append(
            eid, [NewEvent("STEP_COMPLETED", {"n": i}) for i in range(10)], expected_sequence=0
        )
    audit = find_audit_store(storage)
    assert (await audit.verify("chain-a")).ok
    change, reason = EDITS[edit]
    database = sqlite3.connect(tmp_path / "loom.db")
    try:
        change(database, "chain-a")
        database.commit()
    finally:
        database.close()
    result = await audit.verify("chain-a")
    assert isinstance(result, ChainBroken)
    assert result.reason == reason
    assert (await audit.verify("chain-b")).ok


async def test_a_cut_tail_needs_the_exported_head(
    storage: Storage, tmp_path: Path
) -> None:
    await storage.events.append("e", [NewEvent("X", i) for i in range(10)], expected_sequence=0)
    audit = find_audit_store(storage)
    head = await audit.export_head("e")
    database = sqlite3.connect(tmp_path / "loom.db")
    try:
        # SQLite's head is one past the last row, so the cut takes the head along.
        database.execute("DELETE FROM loom_events WHERE execution_id = ? AND sequence >= 7",
                         ("e",))
        database.commit()
    finally:
        database.close()
    assert (await audit.verify("e")).ok  # what the walk alone cannot see
    result = await audit.verify("e", head=head)
    assert isinstance(result, ChainBroken)
    assert (result.sequence, result.reason) == (9, "head_truncated")


# One fixed statement per column: SQL text is never built from values.
COLUMNS: dict[str, tuple[str, str]] = {
    column: (
        f"SELECT {column} FROM loom_events WHERE execution_id = ? AND sequence = ?",
        f"UPDATE loom_events SET {column} = ? WHERE execution_id = ? AND sequence = ?",
    )
    for column in ("kind", "payload", "metadata")
}


def _flipped(rng: random.Random, text: str, column: str) -> str | None:
    """``text`` with one bit of one byte flipped, if it is still a valid value of
    ``column`` that means something else (what the walk, not the JSON parser, must catch)."""
    raw = bytearray(text.encode("utf-8"))
    raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    try:
        changed = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if column == "kind":
        return changed if changed and changed.isprintable() else None
    try:
        same = json.loads(changed) == json.loads(text)
    except ValueError:
        return None
    return None if same else changed


async def test_random_byte_flips_in_the_sqlite_rows_are_all_caught(
    storage: Storage, tmp_path: Path
) -> None:
    ids = [f"chain-{n}" for n in range(10)]
    for eid in ids:
        token = await storage.events.acquire_fence(eid)
        await storage.events.append(
            eid,
            [NewEvent("STEP_COMPLETED", {"n": i, "text": f"step {i}", "amount": i / 4},
                      {"node": "a"}) for i in range(30)],
            expected_sequence=0,
            fence=token,
        )
    audit = find_audit_store(storage)
    rng = random.Random(7)
    database = sqlite3.connect(tmp_path / "loom.db")
    caught = tried = 0
    try:
        while tried < 300:
            eid, sequence = rng.choice(ids), rng.randrange(30)
            column = rng.choice(sorted(COLUMNS))
            select, update = COLUMNS[column]
            (text,) = database.execute(select, (eid, sequence)).fetchone()
            changed = _flipped(rng, text, column)
            if changed is None:
                continue
            database.execute(update, (changed, eid, sequence))
            database.commit()
            tried += 1
            caught += not (await audit.verify(eid)).ok
            database.execute(update, (text, eid, sequence))
            database.commit()
    finally:
        database.close()
    print(f"\nSQLite byte flips: {caught}/{tried} caught")
    assert caught == tried
    assert all([(await audit.verify(eid)).ok for eid in ids])
