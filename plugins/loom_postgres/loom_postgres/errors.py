"""Errors only the PostgreSQL backend raises, placed in the kernel's tree::

    LoomError
    └── StorageError
        ├── ConnectionRejectedError         the server answered and refused the login (a
        │                                   wrong password, no such role or database,
        │                                   pg_hba.conf): refused at once, never retried
        ├── StorageWriteError
        │   └── WriteOutcomeUnknownError    (the kernel's, re-exported here) the connection
        │                                   died after COMMIT was sent
        └── StorageUnavailableError
            ├── LockTimeoutError           lock_timeout expired; nothing was written
            └── SchemaMigrationError       the boot could not migrate; retry the boot
                └── SchemaTooNewError      a newer loom-postgres migrated the schema:
                                           upgrade this one (a retry cannot mend it)

Every other failure is one of the kernel's own errors (``StorageWriteError``,
``StorageReadError``, ``StorageUnavailableError``, the conflicts).
"""

from __future__ import annotations

from loom_core.errors import StorageError, StorageUnavailableError, WriteOutcomeUnknownError

__all__ = [
    "ConnectionRejectedError",
    "LockTimeoutError",
    "SchemaMigrationError",
    "SchemaTooNewError",
    "WriteOutcomeUnknownError",
]


class ConnectionRejectedError(StorageError):
    """The server was reached and refused to let this role in: ``reason`` is
    ``"password"`` (wrong, or a role that does not exist: the server does not say which),
    ``"no_password"``, ``"role"``, ``"login"`` (a role without LOGIN), ``"database"``,
    ``"privilege"`` (no CONNECT on the database), ``"pg_hba"`` or ``"authentication"``
    (another method failed). ``server`` is ``host:port`` (or the socket), ``user`` and
    ``database`` what was asked for. Retrying cannot mend it, so opening a storage raises
    it at once; the message never holds the password.

    Not a :class:`~loom_core.StorageUnavailableError`: the server is there, and waiting for
    it helps nothing until someone fixes the URL, the role or the server's configuration.
    """

    def __init__(
        self, *, reason: str, server: str, user: str, database: str, explanation: str
    ) -> None:
        self.reason = reason
        self.server = server
        self.user = user
        self.database = database
        super().__init__(explanation)


class LockTimeoutError(StorageUnavailableError):
    """A lock this operation needed stayed held past ``lock_timeout`` (another session
    holds the execution's fence or head row). Nothing was written: retry later."""

    def __init__(self, operation: str, execution_id: str | None, detail: str) -> None:
        self.operation = operation
        self.execution_id = execution_id
        self.landed = False
        target = f" on {execution_id!r}" if execution_id is not None else ""
        super().__init__(
            f"{operation}{target} gave up waiting for a lock ({detail}); nothing was "
            "written; retry, or raise lock_timeout if another session holds it for long"
        )


class SchemaMigrationError(StorageUnavailableError):
    """The schema could not be created or migrated (a lock wait timed out, or the role may
    not create tables). Nothing half-done is kept: the boot is safe to retry."""


class SchemaTooNewError(SchemaMigrationError):
    """The schema (``schema``) is at version ``found``, newer than the newest this
    loom-postgres knows (``supported``): a newer loom-postgres migrated it. Refused before
    anything is written, as this version would misread what the newer one changed; unlike
    its parent, retrying cannot mend it. Upgrade loom-postgres on this node to the version
    that migrated the schema (or, to roll back, restore the backup taken before the
    migration)."""

    def __init__(self, schema: str, found: int, supported: int) -> None:
        self.schema = schema
        self.found = found
        self.supported = supported
        super().__init__(
            f"the Loom schema {schema!r} is at version {found}, newer than this "
            f"loom-postgres knows (up to {supported}): a newer loom-postgres migrated it; "
            "nothing was written. Upgrade loom-postgres on this node (pip install -U "
            "loom-postgres) to the version that migrated the schema, or restore the "
            "backup taken before that migration"
        )
