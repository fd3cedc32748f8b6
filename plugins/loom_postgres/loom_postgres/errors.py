"""Errors only the PostgreSQL backend raises, placed in the kernel's tree::

    LoomError
    └── StorageError
        ├── StorageWriteError
        │   └── WriteOutcomeUnknownError    the connection died after COMMIT was sent
        └── StorageUnavailableError
            ├── LockTimeoutError           lock_timeout expired; nothing was written
            └── SchemaMigrationError       the boot could not migrate; retry the boot

Every other failure is one of the kernel's own errors (``StorageWriteError``,
``StorageReadError``, ``StorageUnavailableError``, the conflicts).
"""

from __future__ import annotations

from loom_core.errors import StorageUnavailableError, StorageWriteError

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


class WriteOutcomeUnknownError(StorageWriteError):
    """The connection was lost after the write was sent and the store could not find out
    whether it committed (the server stayed unreachable). Re-read the log before acting:
    the write may or may not be there."""

    def __init__(self, operation: str, execution_id: str, cause: str) -> None:
        self.operation = operation
        self.execution_id = execution_id
        super().__init__(
            f"{operation} on {execution_id!r}: the connection was lost after the write was "
            f"sent and the outcome could not be checked ({cause}); it may or may not have "
            "landed: re-read the log before deciding"
        )


class SchemaMigrationError(StorageUnavailableError):
    """The schema could not be created or migrated (a lock wait timed out, or the role may
    not create tables). Nothing half-done is kept: the boot is safe to retry."""
