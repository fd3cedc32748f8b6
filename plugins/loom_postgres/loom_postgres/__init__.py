"""PostgreSQL event, timer and lease stores for Loom.

Install ``loom-postgres`` and open ``postgresql://user@host/db`` (or ``postgres://``)
with :func:`loom_core.open_storage`; the three stores share one psycopg pool. The schema
is created on first connect; :func:`migrate` runs the same step explicitly.
"""

from loom_postgres.backfill import backfill_park_fences, migrate
from loom_postgres.errors import (
    ConnectionRejectedError,
    LockTimeoutError,
    SchemaMigrationError,
    SchemaTooNewError,
    WriteOutcomeUnknownError,
)
from loom_postgres.events import LostConnectionStats, PostgresEventStore
from loom_postgres.leases import PostgresLeaseStore
from loom_postgres.options import PostgresOptions
from loom_postgres.schema import SCHEMA_VERSION, MigrationReport
from loom_postgres.storage import open_postgres
from loom_postgres.timers import PostgresTimerStore

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "ConnectionRejectedError",
    "LockTimeoutError",
    "LostConnectionStats",
    "MigrationReport",
    "PostgresEventStore",
    "PostgresLeaseStore",
    "PostgresOptions",
    "PostgresTimerStore",
    "SchemaMigrationError",
    "SchemaTooNewError",
    "WriteOutcomeUnknownError",
    "__version__",
    "backfill_park_fences",
    "migrate",
    "open_postgres",
]
