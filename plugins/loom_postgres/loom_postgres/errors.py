"""Errors only the PostgreSQL backend raises, placed in the kernel's tree::

    LoomError
    └── StorageError
        ├── StorageWriteError
        │   └── WriteOutcomeUnknownError    (the kernel's, re-exported here) the connection
        │                                   died after COMMIT was sent
        └── StorageUnavailableError
            ├── LockTimeoutError           lock_timeout expired; nothing was written
            └── SchemaMigrationError       the boot could not migrate; retry the boot

Every other failure is one of the kernel's own errors (``StorageWriteError``,
``StorageReadError``, ``StorageUnavailableError``, the conflicts).
"""

from __future__ import annotations

from loom_core.errors import StorageUnavailableError, WriteOutcomeUnknownError

__all__ = ["LockTimeoutError", "SchemaMigrationError", "WriteOutcomeUnknownError"]


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
