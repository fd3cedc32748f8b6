"""loom-tenant: scope one Loom storage to one tenant.

Every execution id, ``list_executions`` page, timer row, lease key and subscription of the
decorated storage is the tenant's only; ids reach the inner store encoded so that no
tenant name or id can collide with or reach into another tenant (see
:mod:`loom_tenant.codec`). Register it by installing the distribution (entry point
``loom``: ``tenant``), then::

    open_storage(url, decorators=[("tenant", {"tenant": "acme"})])
"""

from loom_tenant.codec import MAX_TENANT_BYTES, TenantCodec, check_tenant
from loom_tenant.events import TenantEventStore
from loom_tenant.leases import TenantLeaseStore
from loom_tenant.plugin import TenantDecorator, tenant_view
from loom_tenant.rls import enable_row_level_security, session_options, session_url
from loom_tenant.timers import TenantTimerStore

__all__ = [
    "MAX_TENANT_BYTES",
    "TenantCodec",
    "TenantDecorator",
    "TenantEventStore",
    "TenantLeaseStore",
    "TenantTimerStore",
    "check_tenant",
    "enable_row_level_security",
    "session_options",
    "session_url",
    "tenant_view",
]
