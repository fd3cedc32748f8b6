"""The ``tenant`` decorator plugin and :func:`tenant_view`.

::

    storage = await open_storage("postgresql://…", decorators=[("tenant", {"tenant": "acme"})])

or, for many tenants over one shared storage::

    shared = await open_storage("postgresql://…")
    acme = tenant_view(shared, "acme")      # closing acme leaves shared open
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, final

from loom_core import Storage
from loom_core.decorating import DecoratorRegistry, InnerOpener, hookimpl
from loom_core.errors import InvalidOptionError
from loom_tenant.codec import TenantCodec
from loom_tenant.events import TenantEventStore
from loom_tenant.leases import TenantLeaseStore
from loom_tenant.timers import TenantTimerStore

__all__ = ["TenantDecorator", "loom_register_decorators", "tenant_view"]

OPTIONS: Final = frozenset({"tenant"})

CONFORMANCE_TENANT: Final = "kit/0:tenant:é"
"""The tenant the conformance kit runs under: a separator-laden, non-ASCII name, so the
kit also exercises the encoding."""


def _wrap(storage: Storage, tenant: str, *, owns: bool) -> Storage:
    codec = TenantCodec(tenant)  # validates once, before anything is wrapped
    return Storage(
        TenantEventStore(storage.events, codec.tenant, owns_inner=owns),
        TenantTimerStore(storage.timers, codec.tenant, owns_inner=owns),
        TenantLeaseStore(storage.leases, codec.tenant, owns_inner=owns),
        url=storage.url,
        on_close=storage.close if owns else None,
    )


def tenant_view(storage: Storage, tenant: str) -> Storage:
    """``tenant``'s view of a ``storage`` shared by several tenants.

    Closing the view does not close ``storage``: its owner closes it once, after the views.
    Raises :class:`~loom_core.errors.InvalidOptionError` for an unacceptable tenant name.
    """
    if not isinstance(storage, Storage):
        raise InvalidOptionError(f"tenant_view needs a Storage, not {type(storage).__name__}")
    return _wrap(storage, tenant, owns=False)


@final
class TenantDecorator:
    """``tenant``: scopes one storage to one tenant. Option ``tenant`` (required, str).

    The decorated storage owns the inner one: closing it closes ``storage``.
    """

    __slots__ = ()

    @property
    def name(self) -> str:
        return "tenant"

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        if not isinstance(storage, Storage):
            raise InvalidOptionError(f"tenant decorates a Storage, not {type(storage).__name__}")
        if not isinstance(options, Mapping):
            raise InvalidOptionError(
                f"tenant options must be a mapping, not {type(options).__name__}"
            )
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise InvalidOptionError(f"unknown tenant option(s) {unknown}; known: tenant")
        if "tenant" not in options:
            raise InvalidOptionError(
                "the tenant decorator needs the option 'tenant' (the tenant's name), e.g. "
                "decorators=[('tenant', {'tenant': 'acme'})]"
            )
        tenant = options["tenant"]
        if not isinstance(tenant, str):
            raise InvalidOptionError(f"tenant must be a str, not {type(tenant).__name__}")
        return _wrap(storage, tenant, owns=True)

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {"tenant": CONFORMANCE_TENANT}


@hookimpl
def loom_register_decorators(registry: DecoratorRegistry) -> None:
    registry.add_decorator(TenantDecorator())
