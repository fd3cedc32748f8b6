"""Registers the ``crypto`` decorator with Loom (entry point ``loom`` → ``crypto``).

Options for ``open_storage(url, decorators=[("crypto", {...})])``:

- ``key_store`` (required): a :class:`~loom_crypto.KeyStore`, kept outside the event
  database (:class:`~loom_crypto.FileKeyStore`, a KMS-backed one, …);
- ``subject_of`` (required): ``subject_of(execution_id, event) -> str | None``, whose key
  seals the event (``None``: plaintext). ``loom_crypto.subject_is_execution`` makes every
  execution its own subject.
- ``legacy_reads`` (default ``False``): also read logs written by loom-crypto 0.1, with
  0.1's guarantees only (docs/crypto.md, "Logs written by 0.1"). Turn it on for a
  migration window, never for good.
- ``incarnation_cache_size`` (an int >= 0, default 4,096): how many executions'
  incarnations are remembered so a fenced append reads no first event (docs/crypto.md,
  "The incarnation").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import final

from loom_core import Storage
from loom_core.decorating import DecoratorRegistry, InnerOpener, hookimpl
from loom_core.errors import InvalidOptionError
from loom_crypto.incarnations import DEFAULT_INCARNATION_CACHE_SIZE
from loom_crypto.memory_keystore import MemoryKeyStore
from loom_crypto.store import CryptoEventStore, subject_is_execution

__all__ = ["CryptoDecorator", "loom_register_decorators"]

_OPTIONS = frozenset({"key_store", "subject_of", "legacy_reads", "incarnation_cache_size"})


@final
class CryptoDecorator:
    """The ``crypto`` storage decorator: seals the event store; timers and leases, which
    hold no payloads, pass through."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return "crypto"

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        if not isinstance(options, Mapping):
            raise InvalidOptionError("crypto options must be a mapping")
        unknown = set(options) - _OPTIONS
        if unknown:
            raise InvalidOptionError(
                f"unknown crypto options {sorted(unknown)}; known: {sorted(_OPTIONS)}"
            )
        key_store = options.get("key_store")
        subject_of = options.get("subject_of")
        if key_store is None or subject_of is None:
            raise InvalidOptionError(
                "crypto needs key_store= (a loom_crypto.KeyStore kept outside the event "
                "database) and subject_of= (execution_id, event) -> subject | None"
            )
        legacy_reads = options.get("legacy_reads", False)
        # The store checks the types; mypy cannot see that they were.
        events = CryptoEventStore(
            storage.events,
            key_store=key_store,  # type: ignore[arg-type]
            subject_of=subject_of,  # type: ignore[arg-type]
            legacy_reads=legacy_reads,  # type: ignore[arg-type]
            incarnation_cache_size=options.get(  # type: ignore[arg-type]
                "incarnation_cache_size", DEFAULT_INCARNATION_CACHE_SIZE
            ),
        )
        return Storage(
            events, storage.timers, storage.leases, url=storage.url, on_close=storage.close
        )

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {"key_store": MemoryKeyStore(), "subject_of": subject_is_execution}


@hookimpl
def loom_register_decorators(registry: DecoratorRegistry) -> None:
    registry.add_decorator(CryptoDecorator())
