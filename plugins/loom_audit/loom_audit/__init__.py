"""loom-audit: every execution's events hash-chained, a verifier that reports the first
broken link, and exported heads that expose a truncated tail.

::

    from loom_core import open_storage
    from loom_audit import export_head, verify

    storage = await open_storage("sqlite:///loom.db", decorators=["audit"])
    ...
    result = await verify(storage, "order-42")
    if result.ok:
        archive(await export_head(storage, "order-42"))  # out of the database's reach
    else:
        alert(result.sequence, result.reason, result.detail)
"""

from loom_audit.chain import CHAIN_FIELD, FORMAT_VERSION, GENESIS, Link, link_hash, read_link
from loom_audit.errors import NoHeadError
from loom_audit.heads import ChainHead
from loom_audit.plugin import AuditDecorator
from loom_audit.stack import export_head, find_audit_store, verify
from loom_audit.store import AuditEventStore
from loom_audit.verification import BreakReason, ChainBroken, ChainIntact, ChainWalk, Verification

__version__ = "0.1.0"

__all__ = [
    "CHAIN_FIELD",
    "FORMAT_VERSION",
    "GENESIS",
    "AuditDecorator",
    "AuditEventStore",
    "BreakReason",
    "ChainBroken",
    "ChainHead",
    "ChainIntact",
    "ChainWalk",
    "Link",
    "NoHeadError",
    "Verification",
    "__version__",
    "export_head",
    "find_audit_store",
    "link_hash",
    "read_link",
    "verify",
]
