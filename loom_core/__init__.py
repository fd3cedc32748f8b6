"""Loom: a durable-execution kernel whose truth is an append-only, fenced event log.

This namespace is what a user of storage needs: :func:`open_storage` and the
:class:`Storage` it returns, the events, the store Protocols to annotate with, the values
passed to and returned by the stores, and every error a caller can meet. Store authors
import from :mod:`loom_core.spi`, decorator authors from :mod:`loom_core.decorating`.
"""

from loom_core.errors import (
    ConflictError,
    ExecutionAlreadyExistsError,
    ExecutionNotFoundError,
    FenceNotIssuedError,
    InvalidEventError,
    InvalidExecutionIdError,
    InvalidInputError,
    InvalidOptionError,
    InvalidSequenceError,
    InvalidURLError,
    LeaseError,
    LeaseHeldError,
    LeaseNotHeldError,
    LoomError,
    PayloadShreddedError,
    PluginError,
    PluginLoadError,
    SequenceConflictError,
    StaleFenceError,
    StorageError,
    StorageReadError,
    StorageUnavailableError,
    StorageWriteError,
    StoreClosedError,
    UnknownSchemeError,
    Unsupported,
    WriteOutcomeUnknownError,
)
from loom_core.events import Event, JsonObject, JsonValue, NewEvent, is_answering
from loom_core.kinds import EventKind
from loom_core.plugins import open_storage
from loom_core.protocols import (
    AppendRequest,
    EventStore,
    FenceAcquired,
    FenceStale,
    Lease,
    LeaseScope,
    LeaseStore,
    Redrive,
    TimerRecord,
    TimerStore,
)
from loom_core.storage import Storage

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # opening storage
    "open_storage",
    "Storage",
    # events
    "Event",
    "NewEvent",
    "JsonValue",
    "JsonObject",
    "EventKind",
    "is_answering",
    # the stores, and what goes in and out of them
    "EventStore",
    "TimerStore",
    "LeaseStore",
    "AppendRequest",
    "FenceAcquired",
    "FenceStale",
    "TimerRecord",
    "Redrive",
    "Lease",
    "LeaseScope",
    # errors (the tree is drawn in loom_core.errors)
    "LoomError",
    "InvalidInputError",
    "InvalidExecutionIdError",
    "InvalidEventError",
    "InvalidSequenceError",
    "FenceNotIssuedError",
    "InvalidOptionError",
    "InvalidURLError",
    "UnknownSchemeError",
    "ConflictError",
    "SequenceConflictError",
    "ExecutionAlreadyExistsError",
    "StaleFenceError",
    "ExecutionNotFoundError",
    "Unsupported",
    "LeaseError",
    "LeaseHeldError",
    "LeaseNotHeldError",
    "StorageError",
    "StorageWriteError",
    "WriteOutcomeUnknownError",
    "StorageReadError",
    "StorageUnavailableError",
    "StoreClosedError",
    "PayloadShreddedError",
    "PluginError",
    "PluginLoadError",
]
