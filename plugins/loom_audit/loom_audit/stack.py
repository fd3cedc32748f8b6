"""Finding the audit layer in a decorated stack, and the module-level entry points."""

from __future__ import annotations

from loom_audit.heads import ChainHead
from loom_audit.store import AuditEventStore
from loom_audit.verification import Verification
from loom_core import Storage
from loom_core.decorating import find_layer
from loom_core.errors import InvalidOptionError
from loom_core.spi import EventStore

__all__ = ["export_head", "find_audit_store", "verify"]


def find_audit_store(target: Storage | EventStore) -> AuditEventStore:
    """The audit decorator in ``target``'s stack (a Storage or an event store), however
    many decorators wrap it."""
    store = find_layer(target, AuditEventStore)
    if store is not None:
        return store
    raise InvalidOptionError(
        "no audit decorator in this store's stack; open it with decorators=['audit', ...]"
    )


async def verify(
    target: Storage | EventStore,
    execution_id: str,
    *,
    head: ChainHead | None = None,
    allow_truncated_prefix: bool = False,
) -> Verification:
    """:meth:`AuditEventStore.verify` on the audit layer of ``target``."""
    return await find_audit_store(target).verify(
        execution_id, head=head, allow_truncated_prefix=allow_truncated_prefix
    )


async def export_head(target: Storage | EventStore, execution_id: str) -> ChainHead:
    """:meth:`AuditEventStore.export_head` on the audit layer of ``target``."""
    return await find_audit_store(target).export_head(execution_id)
