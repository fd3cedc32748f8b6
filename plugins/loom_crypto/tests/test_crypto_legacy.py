"""Logs written by loom-crypto 0.1 (format 1): refused by default, read with 0.1's
guarantees under ``legacy_reads=True``, and shreddable either way.

The 0.1 rows are made the way 0.1 made them, on a real SQLite file: sealed payloads under
format 1's associated data ``["loom-crypto", 1, execution_id, sequence, kind, kid]``, clear
payloads and shred markers bare, and no incarnation in the metadata.
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest
from conftest import subject_prefix
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from loom_crypto import (
    SEALED_MARKER,
    FileKeyStore,
    KeyStore,
    PayloadAuthenticationError,
    UnauthenticatedPayloadError,
    find_crypto_store,
    shred_subject,
)
from loom_crypto.sealing import associated_data

from loom_core import JsonValue, NewEvent, PayloadShreddedError, Storage, open_storage
from loom_core.spi import canonical_json


async def _format_1(keys: KeyStore, subject: str, execution_id: str, sequence: int, kind: str,
                    payload: JsonValue) -> JsonValue:
    key = await keys.create(subject)
    nonce = secrets.token_bytes(12)
    aad = associated_data(execution_id, sequence, kind, key.key_id, None)
    ciphertext = AESGCM(key.material).encrypt(nonce, canonical_json(payload).encode(), aad)
    return {SEALED_MARKER: 1, "kid": key.key_id, "n": base64.b64encode(nonce).decode(),
            "ct": base64.b64encode(ciphertext).decode()}


async def _open(tmp_path: Path, **options: object) -> Storage:
    crypto = ("crypto", {"key_store": FileKeyStore(tmp_path / "keys"),
                         "subject_of": subject_prefix, **options})
    return await open_storage(f"sqlite:///{tmp_path / 'loom.db'}", decorators=[crypto])


@pytest.fixture
async def written_by_0_1(tmp_path: Path) -> Path:
    """alice/1: two format-1 sealed events; public/1: one bare clear event."""
    keys = FileKeyStore(tmp_path / "keys")
    async with await _open(tmp_path) as storage:
        raw = find_crypto_store(storage).inner
        await raw.append("alice/1", [
            NewEvent("X", await _format_1(keys, "alice", "alice/1", 0, "X", {"card": "4111"})),
            NewEvent("Y", await _format_1(keys, "alice", "alice/1", 1, "Y", {"n": 1})),
        ], expected_sequence=0)
        await raw.append("public/1", [NewEvent("X", {"open": True})], expected_sequence=0)
    return tmp_path


async def test_a_0_1_log_is_refused_by_default_and_nothing_is_appended(
    written_by_0_1: Path,
) -> None:
    async with await _open(written_by_0_1) as storage:
        for execution_id in ("alice/1", "public/1"):
            with pytest.raises(UnauthenticatedPayloadError, match="legacy_reads=True") as caught:
                await storage.events.read(execution_id)
            assert (caught.value.execution_id, caught.value.sequence) == (execution_id, 0)
        with pytest.raises(UnauthenticatedPayloadError):
            await storage.events.read("alice/1", from_sequence=1)
        with pytest.raises(UnauthenticatedPayloadError):
            await storage.events.append("alice/1", [NewEvent("Z", 2)], expected_sequence=2)
        assert await storage.events.head("alice/1") == 2
        # A new log is format 2, whatever the old ones are.
        await storage.events.append("alice/2", [NewEvent("X", 1)], expected_sequence=0)
        assert [e.payload for e in await storage.events.read("alice/2")] == [1]


async def test_legacy_reads_opens_a_0_1_log_and_continues_it(written_by_0_1: Path) -> None:
    async with await _open(written_by_0_1, legacy_reads=True) as storage:
        events = storage.events
        assert [e.payload for e in await events.read("alice/1")] == [{"card": "4111"}, {"n": 1}]
        assert [e.payload for e in await events.read("public/1")] == [{"open": True}]
        await events.append("alice/1", [NewEvent("Z", {"n": 2})], expected_sequence=2)
        await events.append("public/1", [NewEvent("X", "more")], expected_sequence=1)
        assert [e.payload for e in await events.read("alice/1", from_sequence=1)] == [
            {"n": 1}, {"n": 2}
        ]
        assert [e.payload for e in await events.read("public/1")] == [{"open": True}, "more"]
        # Format 1 still binds a ciphertext to its event.
        raw = find_crypto_store(storage).inner
        rows = await raw.read("alice/1")
        await raw.delete_execution("alice/1")
        await raw.append("alice/1", [NewEvent(rows[0].kind, rows[1].payload)],
                         expected_sequence=0)
        with pytest.raises(PayloadAuthenticationError):
            await events.read("alice/1")


async def test_a_0_1_log_can_be_shredded_in_either_mode(written_by_0_1: Path) -> None:
    async with await _open(written_by_0_1) as storage:
        result = await shred_subject(storage, "alice")
        assert result.executions == ("alice/1",)
    async with await _open(written_by_0_1, legacy_reads=True) as storage:
        with pytest.raises(PayloadShreddedError):
            await storage.events.read("alice/1")
        markers = await storage.events.read("alice/1", from_sequence=2)
        assert [(e.kind, e.payload) for e in markers] == [
            ("ERASURE_PENDING", {"kid": result.key_id}),
            ("PAYLOAD_SHREDDED", {"kid": result.key_id}),
        ]
        assert (await shred_subject(storage, "alice")).destroyed_now is False


async def test_a_format_2_event_of_a_0_1_log_stripped_of_its_stamp_is_refused(
    written_by_0_1: Path,
) -> None:
    async with await _open(written_by_0_1, legacy_reads=True) as storage:
        await storage.events.append("public/1", [NewEvent("X", "new")], expected_sequence=1)
        raw = find_crypto_store(storage).inner
        rows = await raw.read("public/1")
        await raw.delete_execution("public/1")
        await raw.append("public/1", [NewEvent(r.kind, r.payload) for r in rows],
                         expected_sequence=0)
        with pytest.raises(PayloadAuthenticationError, match="no incarnation stamp"):
            await storage.events.read("public/1")
