"""Two tenants over one SQLite file, ``tenant`` below ``crypto`` (the documented order), and
one key store for both, each tenant seeing it through ``ScopedKeyStore(shared, scope=t)``:
a shred in one tenant leaves the other's same-named subject readable, and a tenant's rows
copied over the other's (SQL ``UPDATE``) do not authenticate there."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from loom_crypto import (
    FileKeyStore,
    KeyStore,
    PayloadAuthenticationError,
    ScopedKeyStore,
    shred_subject,
    subject_is_execution,
)

from loom_core import NewEvent, PayloadShreddedError, Storage, open_storage

ORDER = "order-42"


async def _open(database: Path, keys: KeyStore, tenant: str) -> Storage:
    return await open_storage(
        f"sqlite:///{database}",
        decorators=[
            ("tenant", {"tenant": tenant}),
            ("crypto", {"key_store": ScopedKeyStore(keys, scope=tenant),
                        "subject_of": subject_is_execution}),
        ],
    )


@pytest.fixture
async def tenants(tmp_path: Path) -> AsyncIterator[tuple[Storage, Storage, Path]]:
    database, keys = tmp_path / "loom.db", FileKeyStore(tmp_path / "keys")
    acme = await _open(database, keys, "acme")
    zeta = await _open(database, keys, "zeta")
    for storage, who in ((acme, "acme"), (zeta, "zeta")):
        await storage.events.append(
            ORDER, [NewEvent("EXECUTION_STARTED", {"card": f"{who}-4111"})], expected_sequence=0
        )
    yield acme, zeta, database
    await acme.close()
    await zeta.close()


async def test_shredding_one_tenants_subject_leaves_the_others_readable(
    tenants: tuple[Storage, Storage, Path],
) -> None:
    acme, zeta, _ = tenants

    result = await shred_subject(acme, ORDER)

    assert result.executions == (ORDER,)
    with pytest.raises(PayloadShreddedError):
        await acme.events.read(ORDER)
    assert [e.payload for e in await zeta.events.read(ORDER)] == [{"card": "zeta-4111"}]


async def test_a_tenants_rows_copied_over_the_others_are_refused(
    tenants: tuple[Storage, Storage, Path],
) -> None:
    acme, zeta, database = tenants
    with sqlite3.connect(database) as sql:
        sql.execute(
            "UPDATE loom_events SET (payload, metadata) = (SELECT payload, metadata "
            "FROM loom_events WHERE execution_id = ? AND sequence = 0) "
            "WHERE execution_id = ? AND sequence = 0",
            ("4:acme/" + ORDER, "4:zeta/" + ORDER),
        )
    sql.close()

    with pytest.raises(PayloadAuthenticationError):
        await zeta.events.read(ORDER)
    assert [e.payload for e in await acme.events.read(ORDER)] == [{"card": "acme-4111"}]
