"""One key store shared by several tenants, each through a ``ScopedKeyStore`` of its own:
each tenant's subjects have keys of their own, a shred in one leaves the others readable,
and a row of one tenant does not authenticate in another's log.

Each tenant's log is a store of its own here (what ``tenant`` below crypto hands crypto:
the tenant's own ids, the same in both); the two-tenant stack over one database is tested
in ``plugins/loom_tenant/tests/test_tenant_crypto.py``."""

from __future__ import annotations

import pytest
from loom_crypto import (
    INTEGRITY_SUBJECT,
    SCOPE_PREFIX,
    CryptoEventStore,
    KeyDestroyedError,
    KeyNotFoundError,
    KeyOutOfScopeError,
    KeyStore,
    PayloadAuthenticationError,
    ScopedKeyStore,
    shred_subject,
    subject_is_execution,
)

from loom_core import (
    EventKind,
    InvalidExecutionIdError,
    InvalidOptionError,
    NewEvent,
    PayloadShreddedError,
)
from loom_core.memory import MemoryEventStore

ORDER = "order-42"


def _tenant(shared: KeyStore, scope: str) -> tuple[CryptoEventStore, MemoryEventStore]:
    inner = MemoryEventStore()
    keys = ScopedKeyStore(shared, scope=scope)
    return CryptoEventStore(inner, key_store=keys, subject_of=_subject_of), inner


def _subject_of(execution_id: str, event: NewEvent) -> str | None:
    """Every execution its own subject; ``public`` events in the clear."""
    return None if event.kind == "PUBLIC" else subject_is_execution(execution_id, event)


async def _write(store: CryptoEventStore, execution_id: str, who: str) -> None:
    await store.append(
        execution_id,
        [NewEvent(EventKind.EXECUTION_STARTED, {"card": f"{who}-4111"}),
         NewEvent("PUBLIC", {"open": who})],
        expected_sequence=0,
    )


async def _copy_log(source: MemoryEventStore, target: MemoryEventStore, execution_id: str) -> None:
    """Replace ``target``'s log with ``source``'s rows as stored (a database copy)."""
    await target.delete_execution(execution_id)
    rows = await source.read(execution_id)
    await target.append(
        execution_id,
        [NewEvent(e.kind, e.payload, e.metadata) for e in rows],
        expected_sequence=0,
    )


async def test_each_scope_has_keys_of_its_own_for_the_same_subject(key_store: KeyStore) -> None:
    acme, zeta = ScopedKeyStore(key_store, scope="acme"), ScopedKeyStore(key_store, scope="zeta")

    acme_key, zeta_key = await acme.create(ORDER), await zeta.create(ORDER)

    assert acme_key.key_id != zeta_key.key_id
    assert acme_key.material != zeta_key.material
    assert await acme.key_id_for(ORDER) == acme_key.key_id
    assert await zeta.key_id_for(ORDER) == zeta_key.key_id
    # In the shared store: one subject each, none of them the bare name.
    assert await key_store.key_id_for(ORDER) is None
    assert await key_store.key_id_for(f"{SCOPE_PREFIX}4:acme/{ORDER}") == acme_key.key_id
    # The bytes handed out are the scope's, not the shared store's own.
    assert (await key_store.get(acme_key.key_id)).material != acme_key.material
    # Another process over the same store derives the same bytes.
    again = ScopedKeyStore(key_store, scope="acme")
    assert (await again.get(acme_key.key_id)).material == acme_key.material
    assert (await again.create(ORDER)).material == acme_key.material


async def test_shredding_a_subject_in_one_scope_leaves_the_other_readable(
    key_store: KeyStore,
) -> None:
    acme, _ = _tenant(key_store, "acme")
    zeta, _ = _tenant(key_store, "zeta")
    await _write(acme, ORDER, "acme")
    await _write(zeta, ORDER, "zeta")

    result = await shred_subject(acme, ORDER)

    assert result.key_id == await acme.key_store.key_id_for(ORDER)
    assert result.executions == (ORDER,)
    with pytest.raises(PayloadShreddedError):
        await acme.read(ORDER)
    assert [e.payload for e in await zeta.read(ORDER)] == [
        {"card": "zeta-4111"}, {"open": "zeta"}
    ]
    # zeta can still write for its subject: its key was never destroyed.
    await zeta.append(ORDER, [NewEvent("X", {"more": 1})], expected_sequence=2)


async def test_a_log_copied_from_one_scope_to_another_is_refused(key_store: KeyStore) -> None:
    acme, acme_rows = _tenant(key_store, "acme")
    zeta, zeta_rows = _tenant(key_store, "zeta")
    await _write(acme, ORDER, "acme")
    await _write(zeta, ORDER, "zeta")

    await _copy_log(acme_rows, zeta_rows, ORDER)

    with pytest.raises(PayloadAuthenticationError):
        await zeta.read(ORDER)
    # Each payload alone: the sealed one and the clear one (its MAC is acme's).
    for sequence in (0, 1):
        with pytest.raises(PayloadAuthenticationError) as caught:
            await zeta.read(ORDER, from_sequence=sequence, to_sequence=sequence)
        assert (caught.value.execution_id, caught.value.sequence) == (ORDER, sequence)
    # In its own scope the same rows open.
    assert [e.payload for e in await acme.read(ORDER)] == [
        {"card": "acme-4111"}, {"open": "acme"}
    ]


async def test_without_scopes_a_shared_key_store_mixes_tenants(key_store: KeyStore) -> None:
    """Why the scope is needed (docs/crypto.md, "Order with tenant"), and that a key
    store used without one behaves as before."""
    acme_rows, zeta_rows = MemoryEventStore(), MemoryEventStore()
    acme = CryptoEventStore(acme_rows, key_store=key_store, subject_of=_subject_of)
    zeta = CryptoEventStore(zeta_rows, key_store=key_store, subject_of=_subject_of)
    await _write(acme, ORDER, "acme")

    await _copy_log(acme_rows, zeta_rows, ORDER)

    assert [e.payload for e in await zeta.read(ORDER)] == [
        {"card": "acme-4111"}, {"open": "acme"}
    ]


async def test_a_log_sealed_without_a_scope_does_not_open_through_one(
    key_store: KeyStore,
) -> None:
    rows = MemoryEventStore()
    plain = CryptoEventStore(rows, key_store=key_store, subject_of=_subject_of)
    await _write(plain, ORDER, "acme")
    scoped = CryptoEventStore(
        rows, key_store=ScopedKeyStore(key_store, scope="acme"), subject_of=_subject_of
    )

    with pytest.raises(PayloadAuthenticationError):
        await scoped.read(ORDER, from_sequence=0, to_sequence=0)
    assert [e.payload for e in await plain.read(ORDER)] == [
        {"card": "acme-4111"}, {"open": "acme"}
    ]


async def test_the_integrity_subject_is_still_refused_by_shred_in_a_scope(
    key_store: KeyStore,
) -> None:
    acme, _ = _tenant(key_store, "acme")
    await _write(acme, ORDER, "acme")
    with pytest.raises(InvalidOptionError, match="reserved"):
        await shred_subject(acme, INTEGRITY_SUBJECT)


@pytest.mark.parametrize("scope", ["", "a/b", "4:acme/", "é"])
async def test_any_tenant_name_is_a_scope_of_its_own(key_store: KeyStore, scope: str) -> None:
    keys = ScopedKeyStore(key_store, scope=scope)
    other = ScopedKeyStore(key_store, scope=scope + "x")
    assert (await keys.create(ORDER)).key_id != (await other.create(ORDER)).key_id


@pytest.mark.parametrize("scope", [None, 4, b"acme", "ac\x00me", "a\nb", "x" * 513])
def test_a_bad_scope_is_refused(key_store: KeyStore, scope: object) -> None:
    with pytest.raises(InvalidOptionError, match="scope"):
        ScopedKeyStore(key_store, scope=scope)  # type: ignore[arg-type]


def test_a_bad_inner_key_store_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="KeyStore"):
        ScopedKeyStore(object(), scope="acme")  # type: ignore[arg-type]


async def test_a_subject_too_long_once_scoped_is_refused_and_nothing_is_written(
    key_store: KeyStore,
) -> None:
    acme, rows = _tenant(key_store, "acme")
    long_id = "o" * 500  # a valid id and subject alone; 520 bytes once scoped

    with pytest.raises(InvalidExecutionIdError, match="in scope 'acme'"):
        await acme.append(long_id, [NewEvent("X", {"card": 1})], expected_sequence=0)

    assert await rows.head(long_id) == 0


async def test_a_key_destroyed_through_another_scoped_store_is_not_handed_out(
    key_store: KeyStore,
) -> None:
    mine, theirs = ScopedKeyStore(key_store, scope="acme"), ScopedKeyStore(key_store, scope="acme")
    key = await mine.create(ORDER)
    assert (await mine.get(key.key_id)).material == key.material

    assert await theirs.key_id_for(ORDER) == key.key_id  # another process of the same scope
    assert await theirs.destroy(key.key_id)

    with pytest.raises(KeyDestroyedError):
        await mine.get(key.key_id)
    with pytest.raises(KeyDestroyedError):
        await mine.create(ORDER)
    assert await mine.was_destroyed(key.key_id)


async def test_destroying_another_scopes_key_is_refused_and_the_key_stays_live(
    key_store: KeyStore,
) -> None:
    acme, zeta = ScopedKeyStore(key_store, scope="acme"), ScopedKeyStore(key_store, scope="zeta")
    acme_key, zeta_key = await acme.create(ORDER), await zeta.create(ORDER)

    for store, other in ((acme, zeta_key), (zeta, acme_key)):
        with pytest.raises(KeyOutOfScopeError, match="key_id_for") as caught:
            await store.destroy(other.key_id)
        assert isinstance(caught.value, KeyNotFoundError)
        assert (caught.value.key_id, caught.value.scope) == (other.key_id, store.scope)

    assert not await key_store.was_destroyed(acme_key.key_id)
    assert not await key_store.was_destroyed(zeta_key.key_id)
    assert (await zeta.get(zeta_key.key_id)).material == zeta_key.material
    assert (await acme.create(ORDER)).material == acme_key.material
    # A key the scope's own key_id_for named is destroyed, and only that one.
    assert await acme.key_id_for(ORDER) == acme_key.key_id
    assert await acme.destroy(acme_key.key_id)
    assert not await acme.destroy(acme_key.key_id)
    assert (await zeta.create(ORDER)).material == zeta_key.material


async def test_a_key_id_this_scoped_store_never_looked_up_is_not_destroyed(
    key_store: KeyStore,
) -> None:
    """A key id of the shared store that no subject of the scope was seen to have (one
    written by another scope, or by the shared store used without a scope) is refused,
    however it was learnt: from a row of another tenant's log, say."""
    unscoped = await key_store.create(ORDER)
    acme = ScopedKeyStore(key_store, scope="acme")

    with pytest.raises(KeyOutOfScopeError):
        await acme.destroy(unscoped.key_id)
    assert await acme.get(unscoped.key_id)  # get answers it: with acme's own bytes

    assert not await key_store.was_destroyed(unscoped.key_id)
    # The scope's own key, as create handed it out: destroyed once key_id_for has named it.
    created = await acme.create(ORDER)
    with pytest.raises(KeyOutOfScopeError):
        await acme.destroy(created.key_id)
    assert await acme.key_id_for(ORDER) == created.key_id
    assert await acme.destroy(created.key_id)


async def test_a_shred_through_a_fresh_scoped_store_destroys_the_scopes_key(
    key_store: KeyStore,
) -> None:
    """Another process (a new ScopedKeyStore over the same shared store) that never wrote
    the subject shreds it: shred_subject looks the key up first, so it is not refused."""
    writer, rows = _tenant(key_store, "acme")
    zeta, _ = _tenant(key_store, "zeta")
    await _write(writer, ORDER, "acme")
    await _write(zeta, ORDER, "zeta")
    later = CryptoEventStore(
        rows, key_store=ScopedKeyStore(key_store, scope="acme"), subject_of=_subject_of
    )

    result = await shred_subject(later, ORDER)

    assert result.destroyed_now
    assert await key_store.was_destroyed(await writer.key_store.key_id_for(ORDER) or "")
    with pytest.raises(PayloadShreddedError):
        await writer.read(ORDER)
    assert (await zeta.read(ORDER))[0].payload == {"card": "zeta-4111"}
