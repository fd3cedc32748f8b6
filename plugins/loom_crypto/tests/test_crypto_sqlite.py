"""Crypto over the SQLite backend: the file on disk holds ciphertext only, a shredded key
is in none of its bytes, and a ciphertext moved by SQL is rejected."""

from __future__ import annotations

import base64
import itertools
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import subject_prefix
from loom_crypto import (
    FileKeyStore,
    KeyDestroyedError,
    PayloadAuthenticationError,
    find_crypto_store,
    shred_subject,
)

from loom_core import NewEvent, PayloadShreddedError, Storage, open_storage

SECRET = "4111 1111 1111 1111"


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'loom.db'}"


def _database_bytes(tmp_path: Path) -> bytes:
    """The database file and its WAL and shared-memory files, as they are on disk."""
    return b"".join(p.read_bytes() for p in sorted((tmp_path / "db").glob("loom.db*")))


def _forms(material: bytes) -> list[bytes]:
    return [material, base64.b64encode(material), material.hex().encode()]


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Storage]:
    (tmp_path / "db").mkdir()
    keys = FileKeyStore(tmp_path / "keys")
    crypto = ("crypto", {"key_store": keys, "subject_of": subject_prefix})
    async with open_storage(_url(tmp_path), decorators=[crypto]) as opened:
        yield opened


async def _populate(storage: Storage) -> None:
    events = storage.events
    await events.append("alice/1", [NewEvent("X", {"card": SECRET}), NewEvent("Y", {"n": 1})],
                        expected_sequence=0)
    await events.append("bob/1", [NewEvent("X", {"card": "5500 0000 0000 0004"})],
                        expected_sequence=0)


async def test_the_sqlite_file_holds_no_plaintext(storage: Storage, tmp_path: Path) -> None:
    await _populate(storage)
    assert (await storage.events.read("alice/1"))[0].payload == {"card": SECRET}
    held = _database_bytes(tmp_path)
    assert b"alice/1" in held  # the rows are there (ids and kinds stay plaintext) ...
    assert SECRET.encode() not in held  # ... their payloads are not


async def test_after_shredding_the_key_is_in_no_byte_of_the_sqlite_file(
    storage: Storage, tmp_path: Path
) -> None:
    await _populate(storage)
    crypto = find_crypto_store(storage)
    kid = await crypto.key_store.key_id_for("alice")
    assert kid is not None
    material = (await crypto.key_store.get(kid)).material

    await shred_subject(storage, "alice")

    with pytest.raises(PayloadShreddedError) as caught:
        await storage.events.read("alice/1")
    assert isinstance(caught.value.__cause__, KeyDestroyedError)
    assert (await storage.events.read("bob/1"))[0].payload == {"card": "5500 0000 0000 0004"}
    held = _database_bytes(tmp_path) + b"".join(
        p.read_bytes() for p in sorted((tmp_path / "keys").rglob("*")) if p.is_file()
    )
    assert not any(form in held for form in _forms(material))


async def test_a_shred_holds_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    crypto = ("crypto", {"key_store": FileKeyStore(tmp_path / "keys"),
                         "subject_of": subject_prefix})
    async with open_storage(_url(tmp_path), decorators=[crypto]) as storage:
        await _populate(storage)
        await shred_subject(storage, "alice")
    again = ("crypto", {"key_store": FileKeyStore(tmp_path / "keys"),
                        "subject_of": subject_prefix})
    async with open_storage(_url(tmp_path), decorators=[again]) as storage:
        with pytest.raises(PayloadShreddedError):
            await storage.events.read("alice/1")
        assert len(await storage.events.read("bob/1")) == 1
        assert (await shred_subject(storage, "alice")).destroyed_now is False


async def test_a_ciphertext_moved_by_sql_is_rejected(storage: Storage, tmp_path: Path) -> None:
    for owner, n in itertools.product(("alice", "bob"), range(2)):
        await storage.events.append(
            f"{owner}/{n}", [NewEvent("X", {"v": i}) for i in range(3)], expected_sequence=0
        )
    positions = [(f"{o}/{n}", s) for o, n in itertools.product(("alice", "bob"), range(2))
                 for s in range(3)]
    database = sqlite3.connect(tmp_path / "db" / "loom.db")
    try:
        rows = dict(
            ((e, s), p) for e, s, p in database.execute(
                "SELECT execution_id, sequence, payload FROM loom_events"
            )
        )
        rejected = 0
        for source, target in itertools.permutations(positions, 2):
            database.execute(
                "UPDATE loom_events SET payload = ? WHERE execution_id = ? AND sequence = ?",
                (rows[source], *target),
            )
            database.commit()
            with pytest.raises(PayloadAuthenticationError):
                await storage.events.read(target[0], from_sequence=target[1],
                                          to_sequence=target[1])
            rejected += 1
            database.execute(
                "UPDATE loom_events SET payload = ? WHERE execution_id = ? AND sequence = ?",
                (rows[target], *target),
            )
            database.commit()
    finally:
        database.close()
    assert rejected == len(positions) * (len(positions) - 1)
    assert [e.payload for e in await storage.events.read("alice/0")] == [
        {"v": 0}, {"v": 1}, {"v": 2}
    ]
