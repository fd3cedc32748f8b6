"""Registers the ``audit`` decorator with Loom (entry point ``loom`` → ``audit``).

Options for ``open_storage(url, decorators=[("audit", {...})])``: ``head_key`` (bytes of at
least 16, optional), the secret that signs exported heads; ``tip_cache_size`` (an int >= 0,
default 4,096), how many executions' chain tips are remembered so a fenced append reads no
predecessor. Stack it *below* crypto
(``decorators=["audit", ("crypto", {...})]``, innermost first) so the chain covers
ciphertext.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import final

from loom_audit.store import AuditEventStore
from loom_audit.tips import DEFAULT_TIP_CACHE_SIZE
from loom_core import Storage
from loom_core.decorating import DecoratorRegistry, InnerOpener, hookimpl
from loom_core.errors import InvalidOptionError

__all__ = ["AuditDecorator", "loom_register_decorators"]


@final
class AuditDecorator:
    """The ``audit`` storage decorator: chains the event store; timers and leases are not
    part of any log and pass through."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return "audit"

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        if not isinstance(options, Mapping):
            raise InvalidOptionError("audit options must be a mapping")
        unknown = set(options) - {"head_key", "tip_cache_size"}
        if unknown:
            raise InvalidOptionError(
                f"unknown audit options {sorted(unknown)}; known: head_key, tip_cache_size"
            )
        # The store checks both; mypy cannot see that it does.
        events = AuditEventStore(
            storage.events,
            head_key=options.get("head_key"),  # type: ignore[arg-type]
            tip_cache_size=options.get("tip_cache_size", DEFAULT_TIP_CACHE_SIZE),  # type: ignore[arg-type]
        )
        return Storage(
            events, storage.timers, storage.leases, url=storage.url, on_close=storage.close
        )

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {}


@hookimpl
def loom_register_decorators(registry: DecoratorRegistry) -> None:
    registry.add_decorator(AuditDecorator())
