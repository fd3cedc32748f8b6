"""The store author's namespace: what a backend plugin implements, and the kit to build it.

A backend is three stores bundled in a :class:`~loom_core.Storage`, opened by a factory
that a plugin registers for a URL scheme::

    from loom_core import Storage
    from loom_core.spi import DEFAULT_LIST_LIMIT, BackendRegistry, RefusesUnoffered, hookimpl

    class MyEventStore(RefusesUnoffered):  # the optional methods refuse until overridden
        async def append(self, execution_id, events, *, expected_sequence, fence=None): ...
        async def read(self, execution_id, *, from_sequence=0, to_sequence=None, limit=None): ...
        async def head(self, execution_id): ...
        async def list_executions(self, *, after=None, limit=DEFAULT_LIST_LIMIT): ...
        async def close(self): ...

    async def open_mystore(url, options):  # a BackendFactory
        return Storage(MyEventStore(), MyTimerStore(), MyLeaseStore(), url=url)

    @hookimpl
    def loom_register_backends(registry: BackendRegistry) -> None:
        registry.add_backend("mystore", open_mystore)

and the module is named by an entry point of the ``loom`` group
(``[project.entry-points.loom] mystore = "mystore.plugin"``).

What is here:

- **The contract**: :class:`EventStore`, :class:`TimerStore`, :class:`LeaseStore` and the
  values they take and return. An optional method (:data:`OPTIONAL_EVENT_STORE_METHODS`)
  is offered when ``capabilities`` names it and otherwise raises
  :class:`~loom_core.errors.Unsupported`; :class:`RefusesUnoffered` does exactly that.
- **The checks** every store runs on its arguments before touching anything (``check_*``,
  with the limits :data:`MAX_ID_BYTES` and :data:`MAX_POSITION`), so that every backend
  refuses the same input with the same typed error, :func:`canonical_json`, and
  :func:`json_text` for a payload a store encodes itself.
  :func:`check_batch` returns a :class:`CheckedEvents`, which every check takes back as
  already checked (a batch checked by a decorator above is not checked again).
- **The kind classification** a conditional fence needs (:func:`is_answering_kind`,
  :data:`ANSWERING_KINDS`, :data:`KERNEL_KINDS`): never keep a list of your own.
- **Plugin loading**: :data:`hookimpl`, :class:`BackendRegistry`, and :class:`PluginHost`
  (``PluginHost(entry_points=False)`` plus ``register`` loads a plugin in-process in a test;
  ``.errors`` says why one did not load); :func:`default_plugins` is the process's host,
  the one :func:`~loom_core.open_storage` uses when given none.

The errors a store raises are in :mod:`loom_core.errors`. Decorators have their own
namespace, :mod:`loom_core.decorating`. Prove a store with ``loom-conformance``
(docs/plugin-authors.md). Everything here is public; the modules it comes from are not.
"""

from loom_core.checked import CheckedEvents
from loom_core.errors import DuplicateRegistrationError
from loom_core.events import Event, NewEvent, build_event, build_new_event
from loom_core.hookspecs import hookimpl
from loom_core.kinds import (
    ANSWERING_KINDS,
    CLASSIFICATION,
    KERNEL_KINDS,
    Classification,
    UnclassifiedKindError,
    is_answering_kind,
)
from loom_core.plugins import PluginHost, default_plugins
from loom_core.protocols import (
    DEFAULT_LIST_LIMIT,
    OPTIONAL_EVENT_STORE_METHODS,
    AppendRequest,
    ConditionalFence,
    EventStore,
    FenceAcquired,
    FenceStale,
    Lease,
    LeaseScope,
    LeaseStore,
    OptionalMethod,
    Redrive,
    TimerRecord,
    TimerStore,
)
from loom_core.refusal import RefusesUnoffered
from loom_core.registry import BackendFactory, BackendRegistry, InnerOpener
from loom_core.validation import (
    MAX_EVENTS_PER_APPEND,
    MAX_ID_BYTES,
    MAX_INT_BITS,
    MAX_POSITION,
    canonical_json,
    check_append,
    check_append_requests,
    check_aware,
    check_batch,
    check_events,
    check_events_with_text,
    check_execution_id,
    check_fence,
    check_key,
    check_limit,
    check_read,
    check_sequence,
    check_timer_record,
    check_ttl,
    json_text,
)

__all__ = [
    # the contract
    "EventStore",
    "TimerStore",
    "LeaseStore",
    "OPTIONAL_EVENT_STORE_METHODS",
    "OptionalMethod",
    "DEFAULT_LIST_LIMIT",
    "AppendRequest",
    "ConditionalFence",
    "FenceAcquired",
    "FenceStale",
    "TimerRecord",
    "Redrive",
    "Lease",
    "LeaseScope",
    "Event",
    "NewEvent",
    "build_event",
    "build_new_event",
    "RefusesUnoffered",
    # the checks every store runs before touching anything
    "MAX_EVENTS_PER_APPEND",
    "MAX_ID_BYTES",
    "MAX_INT_BITS",
    "MAX_POSITION",
    "CheckedEvents",
    "canonical_json",
    "check_append",
    "check_append_requests",
    "check_aware",
    "check_batch",
    "check_events",
    "check_events_with_text",
    "check_execution_id",
    "check_fence",
    "check_key",
    "check_limit",
    "check_read",
    "check_sequence",
    "check_timer_record",
    "check_ttl",
    "json_text",
    # the kind classification
    "ANSWERING_KINDS",
    "KERNEL_KINDS",
    "CLASSIFICATION",
    "Classification",
    "is_answering_kind",
    "UnclassifiedKindError",
    # plugin registration and loading
    "hookimpl",
    "BackendFactory",
    "BackendRegistry",
    "InnerOpener",
    "DuplicateRegistrationError",
    "PluginHost",
    "default_plugins",
]
