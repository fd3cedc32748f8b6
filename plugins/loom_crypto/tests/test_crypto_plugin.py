"""The ``crypto`` entry point and its options."""

from __future__ import annotations

from typing import Any

import pytest
from loom_crypto import (
    CryptoDecorator,
    CryptoEventStore,
    KeyStore,
    MemoryKeyStore,
    ScopedKeyStore,
    subject_is_execution,
)

from loom_core import InvalidOptionError, NewEvent, open_storage
from loom_core.spi import PluginHost


def test_the_entry_point_registers_the_crypto_decorator() -> None:
    host = PluginHost()
    assert isinstance(host.decorator("crypto"), CryptoDecorator)
    assert host.decorators.source_of("crypto") == "loom-crypto"
    assert not host.errors


async def test_open_storage_seals_with_the_given_options() -> None:
    options = {"key_store": MemoryKeyStore(), "subject_of": subject_is_execution}
    async with open_storage("memory://", decorators=[("crypto", options)]) as storage:
        assert isinstance(storage.events, CryptoEventStore)
        await storage.events.append("e", [NewEvent("X", {"a": 1})], expected_sequence=0)
        assert (await storage.events.read("e"))[0].payload == {"a": 1}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "crypto needs key_store"),
        ({"key_store": MemoryKeyStore()}, "crypto needs key_store"),
        ({"key_store": object(), "subject_of": subject_is_execution},
         "must implement loom_crypto.KeyStore, got object, which lacks create, destroy, get, "
         "key_id_for, was_destroyed"),
        ({"key_store": MemoryKeyStore(), "subject_of": 3}, "subject_of must be a callable"),
        ({"key_store": MemoryKeyStore(), "subject_of": subject_is_execution, "kms": 1},
         "unknown crypto options"),
    ],
)
async def test_missing_or_wrong_options_are_refused(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        await open_storage("memory://", decorators=[("crypto", options)])


async def test_conformance_options_build_a_working_decorator() -> None:
    decorator = CryptoDecorator()
    options = await decorator.conformance_options(lambda: open_storage("memory://"))
    async with open_storage("memory://", decorators=[("crypto", options)]) as storage:
        await storage.events.append("e", [NewEvent("X", 1)], expected_sequence=0)
        assert (await storage.events.read("e"))[0].payload == 1


class _ForwardingKeyStore:
    """A key store that forwards every method to another, as a proxy around a KMS
    client does: it defines none of them on its class."""

    def __init__(self, inner: KeyStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_key_store_that_forwards_its_methods_is_accepted() -> None:
    # Python 3.12 and 3.13 refused it ("must implement loom_crypto.KeyStore"), 3.11 did not.
    forwarding = _ForwardingKeyStore(MemoryKeyStore())
    options = {"key_store": forwarding, "subject_of": subject_is_execution}
    async with open_storage("memory://", decorators=[("crypto", options)]) as storage:
        await storage.events.append("e", [NewEvent("X", {"a": 1})], expected_sequence=0)
        assert (await storage.events.read("e"))[0].payload == {"a": 1}
    scoped = ScopedKeyStore(forwarding, scope="acme")
    assert (await scoped.create("s")).key_id == await scoped.key_id_for("s")


def test_a_scope_over_something_that_is_not_a_key_store_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="got object, which lacks create, destroy"):
        ScopedKeyStore(object(), scope="acme")  # type: ignore[arg-type]
