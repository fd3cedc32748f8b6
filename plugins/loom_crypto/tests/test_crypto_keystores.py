"""The KeyStore contract, on both shipped key stores, and the file store's durability."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import pickle
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from loom_crypto import (
    KEY_BYTES,
    FileKeyStore,
    KeyDestroyedError,
    KeyNotFoundError,
    KeyStore,
    MemoryKeyStore,
)
from loom_crypto.memory_keystore import YIELD_EVERY

from loom_core import InvalidExecutionIdError, InvalidOptionError, StorageReadError


async def test_create_returns_the_same_key_for_a_subject_and_another_for_others(
    key_store: KeyStore,
) -> None:
    alice = await key_store.create("alice")
    assert len(alice.material) == KEY_BYTES
    assert await key_store.create("alice") == alice
    bob = await key_store.create("bob")
    assert bob.key_id != alice.key_id
    assert bob.material != alice.material
    assert await key_store.get(alice.key_id) == alice
    assert await key_store.key_id_for("alice") == alice.key_id


async def test_a_key_builds_its_cipher_once_and_still_copies_and_pickles_as_id_and_bytes(
    key_store: KeyStore,
) -> None:
    key = await key_store.create("alice")
    nonce = os.urandom(12)
    sealed = key.aead().encrypt(nonce, b"payload", b"bound")
    assert key.aead() is key.aead()
    for twin in (copy.copy(key), copy.deepcopy(key), pickle.loads(pickle.dumps(key))):
        assert twin == key
        assert repr(twin) == repr(key)
        assert twin.aead().decrypt(nonce, sealed, b"bound") == b"payload"


async def test_the_key_id_does_not_name_the_subject(key_store: KeyStore) -> None:
    key = await key_store.create("alice@example.com")
    assert "alice" not in key.key_id


async def test_a_subject_without_a_key_has_none_and_lookup_creates_nothing(
    key_store: KeyStore,
) -> None:
    assert await key_store.key_id_for("nobody") is None
    assert await key_store.key_id_for("nobody") is None
    assert not await key_store.was_destroyed("0" * 32)


async def test_an_unknown_key_is_not_found(key_store: KeyStore) -> None:
    with pytest.raises(KeyNotFoundError):
        await key_store.get("0" * 32)
    with pytest.raises(KeyNotFoundError):
        await key_store.destroy("0" * 32)


async def test_destroy_leaves_a_provable_tombstone_and_refuses_the_subject_for_good(
    key_store: KeyStore,
) -> None:
    key = await key_store.create("alice")
    other = await key_store.create("bob")
    assert not await key_store.was_destroyed(key.key_id)
    assert await key_store.destroy(key.key_id) is True
    assert await key_store.was_destroyed(key.key_id)
    assert await key_store.destroy(key.key_id) is False
    with pytest.raises(KeyDestroyedError) as caught:
        await key_store.get(key.key_id)
    assert caught.value.key_id == key.key_id
    with pytest.raises(KeyDestroyedError):
        await key_store.create("alice")
    assert await key_store.key_id_for("alice") == key.key_id
    assert await key_store.get(other.key_id) == other


@pytest.mark.parametrize("bad", ["", "a\x00b", 7])
async def test_a_bad_subject_is_refused(key_store: KeyStore, bad: object) -> None:
    with pytest.raises(InvalidExecutionIdError):
        await key_store.create(bad)  # type: ignore[arg-type]


def _everything_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _forms(material: bytes) -> list[bytes]:
    return [material, base64.b64encode(material), material.hex().encode()]


async def test_file_store_survives_a_restart_including_the_tombstone(tmp_path: Path) -> None:
    first = FileKeyStore(tmp_path / "keys")
    alice = await first.create("alice")
    bob = await first.create("bob")
    await first.destroy(bob.key_id)

    reopened = FileKeyStore(tmp_path / "keys")
    assert await reopened.get(alice.key_id) == alice
    assert await reopened.create("alice") == alice
    assert await reopened.was_destroyed(bob.key_id)
    with pytest.raises(KeyDestroyedError):
        await reopened.get(bob.key_id)


async def test_file_store_keeps_no_trace_of_a_destroyed_key(tmp_path: Path) -> None:
    store = FileKeyStore(tmp_path / "keys")
    key = await store.create("alice")
    assert any(form in _everything_under(tmp_path) for form in _forms(key.material))
    await store.destroy(key.key_id)
    files = _everything_under(tmp_path)
    assert not any(form in files for form in _forms(key.material))
    assert [p.name for p in (tmp_path / "keys").rglob("*.tmp")] == []


async def test_destroy_also_removes_a_copy_left_by_a_killed_writer(tmp_path: Path) -> None:
    store = FileKeyStore(tmp_path / "keys")
    key = await store.create("alice")
    record = tmp_path / "keys" / "keys" / f"{key.key_id}.json"
    stray = record.with_name(f".{record.name}.0123456789abcdef.tmp")
    stray.write_bytes(record.read_bytes())  # what a process killed before its link leaves
    await store.destroy(key.key_id)
    assert not stray.exists()
    assert not any(form in _everything_under(tmp_path) for form in _forms(key.material))


async def test_file_store_files_are_private(tmp_path: Path) -> None:
    store = FileKeyStore(tmp_path / "keys")
    await store.create("alice")
    for path in (tmp_path / "keys").rglob("*"):
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode & 0o077 == 0, (path, oct(mode))


@pytest.mark.parametrize("part", ["", "subjects", "keys"])
async def test_a_key_directory_others_may_write_to_is_refused(tmp_path: Path, part: str) -> None:
    FileKeyStore(tmp_path / "keys")
    shared = tmp_path / "keys" / part
    shared.chmod(0o777)
    with pytest.raises(InvalidOptionError, match="writable by its group or by others") as caught:
        FileKeyStore(tmp_path / "keys")
    assert f"chmod 700 {shared}" in str(caught.value)
    shared.chmod(0o755)  # readable is not refused: every key file is 0600 itself
    store = FileKeyStore(tmp_path / "keys")
    assert (await store.create("alice")).key_id


async def test_two_processes_creating_one_subject_get_one_key(tmp_path: Path) -> None:
    stores = [FileKeyStore(tmp_path / "keys") for _ in range(8)]
    keys = await asyncio.gather(*(s.create("alice") for s in stores))
    assert len({k.key_id for k in keys}) == 1
    assert len({k.material for k in keys}) == 1
    # The losers removed their unused key records.
    assert len(list((tmp_path / "keys" / "keys").glob("*.json"))) == 1


async def test_a_destroy_by_another_process_is_seen_at_once(tmp_path: Path) -> None:
    here, there = FileKeyStore(tmp_path / "k"), FileKeyStore(tmp_path / "k")
    key = await here.create("alice")
    await there.destroy(key.key_id)
    assert await here.was_destroyed(key.key_id)
    with pytest.raises(KeyDestroyedError):
        await here.get(key.key_id)


async def test_a_key_id_from_the_log_cannot_name_a_path(tmp_path: Path) -> None:
    store = FileKeyStore(tmp_path / "keys")
    (tmp_path / "secret.json").write_text("{}")
    with pytest.raises(KeyNotFoundError):
        await store.get("../../secret")
    assert not await store.was_destroyed("../../secret")


async def test_a_corrupt_key_file_is_reported_not_guessed(tmp_path: Path) -> None:
    store = FileKeyStore(tmp_path / "keys")
    key = await store.create("alice")
    (tmp_path / "keys" / "keys" / f"{key.key_id}.json").write_text("{not json")
    with pytest.raises(StorageReadError, match="not a loom-crypto key file"):
        await store.get(key.key_id)


async def test_a_claim_whose_key_id_ends_in_a_newline_is_corrupt(tmp_path: Path) -> None:
    # A regex anchored with "$" accepts one trailing newline: the claim must match whole.
    store = FileKeyStore(tmp_path / "keys")
    key = await store.create("alice")
    claim = next((tmp_path / "keys" / "subjects").iterdir())
    claim.write_text(json.dumps({"v": 1, "kid": key.key_id + "\n"}))
    with pytest.raises(StorageReadError, match="corrupt"):
        await store.key_id_for("alice")


async def _yielded(call: Callable[[], Awaitable[object]]) -> bool:
    """Whether ``call()`` let the loop run a callback scheduled just before it."""
    ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(ran.set)
    await call()
    yielded = ran.is_set()
    await asyncio.sleep(0)  # the callback runs now if the call did not let it
    return yielded


async def test_the_memory_store_lets_other_tasks_run_on_one_call_in_yield_every() -> None:
    """Every method counts toward the same turn; the first call yields, then one in
    YIELD_EVERY. Which call yields depends only on the count, so runs interleave alike."""
    store = MemoryKeyStore()
    key = await store.create("s-0")  # the first call: yields
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.create("s-1"),
        lambda: store.get(key.key_id),
        lambda: store.key_id_for("s-1"),
        lambda: store.was_destroyed(key.key_id),
    ]
    yielded = [await _yielded(calls[i % len(calls)]) for i in range(1, 4 * YIELD_EVERY)]
    assert [i for i, y in enumerate(yielded, start=1) if y] == [16, 32, 48]
    assert await _yielded(lambda: store.destroy(key.key_id))  # call 64
