"""Every error Loom raises, rooted at :class:`LoomError`.

The tree::

    LoomError
    ├── InvalidInputError (ValueError)         bad input refused before anything is written
    │   ├── InvalidExecutionIdError
    │   ├── InvalidEventError                  kind, payload or metadata is not acceptable
    │   ├── InvalidSequenceError               negative, non-integer or out-of-range sequence
    │   ├── FenceNotIssuedError                .current_fence; a token above any ever issued
    │   ├── InvalidOptionError (TypeError)     an option of the wrong type or value
    │   │   └── LayerBelowFanOutError          (loom_core.decorating) find_layer met a fan-out
    │   └── InvalidURLError
    │       └── UnknownSchemeError             no installed backend serves the URL scheme
    ├── ConflictError                          the store moved on; re-read and decide again
    │   ├── SequenceConflictError              .actual_head
    │   ├── ExecutionAlreadyExistsError        expected_sequence == 0 but the log exists
    │   └── StaleFenceError                    .current_fence; a newer writer holds the execution
    ├── ExecutionNotFoundError (LookupError)
    ├── Unsupported (NotImplementedError)      an optional method this store does not offer
    ├── LeaseError
    │   ├── LeaseHeldError                     .holder, .expires_at
    │   └── LeaseNotHeldError                  renew/release by a non-holder or after expiry
    ├── StorageError                           the backend failed
    │   ├── StorageWriteError                  a write that could not be made durable
    │   │   └── WriteOutcomeUnknownError       the write was sent; whether it landed is unknown
    │   ├── StorageReadError
    │   └── StorageUnavailableError            the backend (or one shard of it) is unreachable
    │       └── StoreClosedError               a call on a store after its close()
    ├── PayloadShreddedError                   the payload's key was destroyed (crypto)
    └── PluginError                            a plugin failed to load, or broke the plugin
        │                                      contract (a factory or decorate() that did
        │                                      not return a Storage)
        ├── PluginLoadError                    .plugin; one broken plugin, reported by name
        ├── DuplicateRegistrationError         .name, .first, .second
        └── DecoratorDefinitionError (TypeError) a decorator class that did not decide
                                                 every optional method

Every refusal of bad input happens before the store is touched, so a refused write leaves
the store exactly as it was.

A caller imports every one of them from :mod:`loom_core` too, except the two only a plugin
author meets: :class:`DuplicateRegistrationError` (also in :mod:`loom_core.spi`) and
:class:`DecoratorDefinitionError` (also in :mod:`loom_core.decorating`). A kernel kind
left unclassified raises ``loom_core.spi.UnclassifiedKindError`` (a ``LoomError`` and a
``TypeError``) when the kernel is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

__all__ = [
    "ConflictError",
    "DecoratorDefinitionError",
    "DuplicateRegistrationError",
    "ExecutionAlreadyExistsError",
    "ExecutionNotFoundError",
    "FenceNotIssuedError",
    "InvalidEventError",
    "InvalidExecutionIdError",
    "InvalidInputError",
    "InvalidOptionError",
    "InvalidSequenceError",
    "InvalidURLError",
    "LeaseError",
    "LeaseHeldError",
    "LeaseNotHeldError",
    "LoomError",
    "PayloadShreddedError",
    "PluginError",
    "PluginLoadError",
    "SequenceConflictError",
    "StaleFenceError",
    "StorageError",
    "StorageReadError",
    "StorageUnavailableError",
    "StorageWriteError",
    "StoreClosedError",
    "UnknownSchemeError",
    "Unsupported",
    "WriteOutcomeUnknownError",
]


class LoomError(Exception):
    """Root of every error Loom raises.

    Every one pickles and copies with its fields (a process pool, a task queue and
    ``copy.deepcopy`` take it), though most take other arguments than the message they
    hold: it is made again as it was, without calling its ``__init__``."""

    def __reduce__(
        self,
    ) -> tuple[
        Callable[[type[LoomError], tuple[object, ...]], LoomError],
        tuple[type[LoomError], tuple[object, ...]],
        dict[str, object],
    ]:
        return _remade, (type(self), self.args), self.__dict__


def _remade(cls: type[LoomError], args: tuple[object, ...]) -> LoomError:
    """A :class:`LoomError` of ``cls`` holding ``args``, its fields set by pickle after."""
    error = cls.__new__(cls)
    error.args = args
    return error


# -- bad input --------------------------------------------------------------------------


class InvalidInputError(LoomError, ValueError):
    """Input refused before the store was touched; nothing was written."""


class InvalidExecutionIdError(InvalidInputError):
    """An execution id (or another key) that is not a non-empty string of at most 512
    UTF-8 bytes free of ASCII control characters (U+0000 to U+001F, U+007F)."""

    def __init__(self, value: object, reason: str, what: str = "execution id") -> None:
        self.value = value
        self.reason = reason
        self.what = what
        super().__init__(f"invalid {what} {value!r}: {reason}")


class InvalidEventError(InvalidInputError):
    """An event whose kind, payload or metadata is not acceptable."""


class InvalidSequenceError(InvalidInputError):
    """A sequence or fence argument that is not a non-negative integer, or out of range."""


class FenceNotIssuedError(InvalidSequenceError):
    """A fence token above the execution's current token: no acquire ever returned it.

    Only a token an acquire returned (or 0, the token of a never-fenced execution) can be
    presented; a larger number is a caller's bug, and accepting it would let that caller
    outrank every later acquire. Nothing was written and no token moved.
    """

    def __init__(self, execution_id: str, presented_fence: int, current_fence: int) -> None:
        self.execution_id = execution_id
        self.presented_fence = presented_fence
        self.current_fence = current_fence
        super().__init__(
            f"fence {presented_fence} for execution {execution_id!r} was never issued: the "
            f"current token is {current_fence}; present the token acquire_fence or "
            "acquire_fence_if returned (or the one the park was written under)"
        )


class InvalidOptionError(InvalidInputError, TypeError):
    """An option of the wrong type or value (a store, decorator or open_storage option)."""


class InvalidURLError(InvalidInputError):
    """A storage URL that cannot be parsed."""


class UnknownSchemeError(InvalidURLError):
    """No installed backend serves this URL scheme."""

    def __init__(self, scheme: str, installed: Iterable[str], hint: str | None = None) -> None:
        self.scheme = scheme
        self.installed = tuple(sorted(installed))
        self.hint = hint
        message = (
            f"no backend is installed for the URL scheme {scheme!r}; "
            f"installed schemes: {', '.join(self.installed) or '(none)'}"
        )
        if hint:
            message += f"; {hint}"
        super().__init__(message)


# -- conflicts --------------------------------------------------------------------------


class ConflictError(LoomError):
    """The store moved on since the caller looked; re-read and decide again."""

    execution_id: str


class SequenceConflictError(ConflictError):
    """The log's head is not where the append expected it."""

    def __init__(self, execution_id: str, expected_sequence: int, actual_head: int) -> None:
        self.execution_id = execution_id
        self.expected_sequence = expected_sequence
        self.actual_head = actual_head
        super().__init__(
            f"append to {execution_id!r} expected sequence {expected_sequence} but the log's "
            f"head is {actual_head}; re-read the log and retry from the actual head"
        )


class ExecutionAlreadyExistsError(ConflictError):
    """An append with ``expected_sequence=0`` to an execution whose log already exists."""

    def __init__(self, execution_id: str, actual_head: int) -> None:
        self.execution_id = execution_id
        self.actual_head = actual_head
        super().__init__(
            f"execution {execution_id!r} already exists (head {actual_head}); "
            "choose another id or read the existing log"
        )


class StaleFenceError(ConflictError):
    """The writer's fence token is no longer the execution's; a newer writer holds it."""

    def __init__(self, execution_id: str, presented_fence: int, current_fence: int) -> None:
        self.execution_id = execution_id
        self.presented_fence = presented_fence
        self.current_fence = current_fence
        super().__init__(
            f"fence {presented_fence} for execution {execution_id!r} is stale: the current "
            f"token is {current_fence}; this writer has been superseded and must stop"
        )


class ExecutionNotFoundError(LoomError, LookupError):
    """The named execution has no log."""

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        super().__init__(f"execution {execution_id!r} has no log")


# -- capabilities -----------------------------------------------------------------------


class Unsupported(LoomError, NotImplementedError):
    """An optional method that this store (or a decorator in front of it) does not offer."""

    def __init__(self, method: str, store: str, reason: str | None = None) -> None:
        self.method = method
        self.store = store
        self.reason = reason
        message = f"{store} does not offer {method}()"
        message += f": {reason}" if reason else "; check store.capabilities before calling it"
        super().__init__(message)


# -- leases -----------------------------------------------------------------------------


class LeaseError(LoomError):
    """A lease operation refused."""


class LeaseHeldError(LeaseError):
    """The lease is held by another holder and has not expired."""

    def __init__(self, key: str, holder: str, expires_at: datetime) -> None:
        self.key = key
        self.holder = holder
        self.expires_at = expires_at
        super().__init__(
            f"lease {key!r} is held by {holder!r} until {expires_at.isoformat()}; "
            "retry after it expires"
        )


class LeaseNotHeldError(LeaseError):
    """Renew or release by a caller that does not hold the lease (or whose lease expired)."""

    def __init__(self, key: str, holder: str) -> None:
        self.key = key
        self.holder = holder
        super().__init__(
            f"{holder!r} does not hold lease {key!r} (released, expired or taken over); "
            "acquire it again before acting"
        )


# -- storage ----------------------------------------------------------------------------


class StorageError(LoomError):
    """The backend failed; the message names the backend and the cause."""


class StorageWriteError(StorageError):
    """A write that could not be made durable. Unless it is a
    :class:`WriteOutcomeUnknownError`, nothing was written; see each backend's table of
    write outcomes (docs/operations.md)."""


class WriteOutcomeUnknownError(StorageWriteError):
    """The write was sent but its outcome could not be learned (a connection lost after
    the commit was sent, a commit that failed half-way to the disk). Re-read the log before
    acting: the write may or may not be there, whole or not at all.

    ``operation`` is what was being done and ``target`` what it was done to (an execution
    id, or the database when the write spanned several)."""

    def __init__(self, operation: str, target: str, cause: str) -> None:
        self.operation = operation
        self.target = target
        super().__init__(
            f"{operation} on {target!r}: the write was sent but its outcome could not be "
            f"learned ({cause}); it may or may not have landed, whole or not at all: "
            "re-read the log before deciding"
        )

    @property
    def execution_id(self) -> str:
        """The execution the write was for, when it was for one (else the target)."""
        return self.target


class StorageReadError(StorageError):
    """A read that the backend could not serve."""


class StorageUnavailableError(StorageError):
    """The backend, or the shard that owns the execution, cannot be reached."""


class StoreClosedError(StorageUnavailableError):
    """A call on a store (event, timer or lease) after its storage was closed. Nothing was
    read or written: open the storage again."""

    def __init__(self, store: str) -> None:
        self.store = store
        super().__init__(f"{store} is closed; nothing was done: open the storage again")


class PayloadShreddedError(LoomError):
    """The key that sealed this payload was destroyed; the payload is gone for good."""

    def __init__(self, execution_id: str, sequence: int, key_id: str) -> None:
        self.execution_id = execution_id
        self.sequence = sequence
        self.key_id = key_id
        super().__init__(
            f"payload of event {sequence} of {execution_id!r} was shredded "
            f"(key {key_id!r} destroyed); its metadata is still readable"
        )


# -- plugins ----------------------------------------------------------------------------


class PluginError(LoomError):
    """A plugin could not be loaded or registered, or broke the plugin contract when it
    was called: a backend factory or a decorator's ``decorate`` whose result is not
    awaitable, or is not a :class:`~loom_core.Storage`."""


class PluginLoadError(PluginError):
    """One plugin failed to load or register; the others are unaffected."""

    def __init__(self, plugin: str, distribution: str | None, cause: BaseException) -> None:
        self.plugin = plugin
        self.distribution = distribution
        self.cause = cause
        source = f" (from {distribution})" if distribution else ""
        super().__init__(f"plugin {plugin!r}{source} failed: {type(cause).__name__}: {cause}")


class DuplicateRegistrationError(PluginError):
    """Two plugins registered the same backend scheme or decorator name."""

    def __init__(self, kind: str, name: str, first: str, second: str) -> None:
        self.kind = kind
        self.name = name
        self.first = first
        self.second = second
        super().__init__(
            f"{kind} {name!r} is registered by both {first} and {second}; "
            "uninstall one of them"
        )


class DecoratorDefinitionError(PluginError, TypeError):
    """A decorator class whose optional-method decisions are missing, unknown or malformed."""
