"""The errors loom-audit adds to the kernel's tree.

::

    LoomError
    └── NoHeadError (LookupError)   .execution_id, .sequence: no chained last event to export

A broken chain is not an error: :meth:`~loom_audit.AuditEventStore.verify` returns it as a
:class:`~loom_audit.ChainBroken` value.
"""

from __future__ import annotations

from loom_core.errors import LoomError

__all__ = ["NoHeadError"]


class NoHeadError(LoomError, LookupError):
    """The log's last event is gone (compacted away) or carries no chain link, so there is
    no head to export."""

    def __init__(self, execution_id: str, sequence: int) -> None:
        self.execution_id = execution_id
        self.sequence = sequence
        super().__init__(
            f"event {sequence} of {execution_id!r} is missing or unchained: there is no head "
            "to export; append through the audit decorator first"
        )
