"""The errors loom-crypto adds to the kernel's tree (all are :class:`~loom_core.LoomError`).

::

    LoomError
    ├── PayloadShreddedError (loom_core)   reading a payload whose key was destroyed;
    │                                      its __cause__ is the KeyDestroyedError
    ├── KeyStoreError                      a key store refused or failed
    │   ├── KeyNotFoundError (LookupError) .key_id unknown to this key store
    │   │   └── KeyOutOfScopeError         .key_id, .scope: a ScopedKeyStore refused to
    │   │                                  destroy a key it does not know as its scope's
    │   ├── KeyDestroyedError              .key_id was destroyed (shredded); proof on file
    │   └── KeyStoreUnavailableError       .operation: the key store failed with an error
    │       (StorageUnavailableError)      that is not a Loom error (a KMS client's
    │                                      connection error); its error is the __cause__
    ├── PayloadAuthenticationError         .execution_id, .sequence: a stored payload that
    │   │                                  does not authenticate for the event it sits in
    │   ├── IncarnationMismatchError       .expected, .found: the event belongs to another
    │   │                                  incarnation of the id (copied from a deleted log)
    │   └── UnauthenticatedPayloadError    the payload carries no authentication at all (a
    │                                      row replaced in plaintext, or format 1 written by
    │                                      loom-crypto 0.1 while legacy_reads is off)
    └── ShredIncompleteError               .key_id: the key store cannot prove destruction,
                                           so no PAYLOAD_SHREDDED tombstone was written

A key store that cannot make a write durable raises the kernel's
:class:`~loom_core.StorageWriteError`.
"""

from __future__ import annotations

from loom_core.errors import LoomError, StorageUnavailableError

__all__ = [
    "KeyDestroyedError",
    "KeyNotFoundError",
    "KeyOutOfScopeError",
    "KeyStoreError",
    "KeyStoreUnavailableError",
    "IncarnationMismatchError",
    "PayloadAuthenticationError",
    "ShredIncompleteError",
    "UnauthenticatedPayloadError",
]


class KeyStoreError(LoomError):
    """A key store refused the request or failed."""


class KeyNotFoundError(KeyStoreError, LookupError):
    """The key id was never created in this key store.

    Seen after a restore that brought back a key store older than the log:
    the log holds payloads sealed under keys this key store never had.
    """

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"key {key_id!r} is unknown to this key store; if the store was restored, it is "
            "older than the log (restore a key-store backup at least as new as the log)"
        )


class KeyOutOfScopeError(KeyNotFoundError):
    """A :class:`~loom_crypto.ScopedKeyStore` was asked to destroy a key it does not know as
    a key of its scope: another scope's (another tenant's), one of the shared store used
    without a scope, or its own but not yet looked up with this store's ``key_id_for``.
    Nothing was destroyed.
    """

    def __init__(self, key_id: str, scope: str) -> None:
        self.key_id = key_id
        self.scope = scope
        KeyStoreError.__init__(
            self,
            f"key {key_id!r} is not known as a key of scope {scope!r}, so it was not "
            "destroyed (a scope destroys only its own subjects' keys, never another "
            "tenant's); look the subject's key up with key_id_for(subject) on this store "
            "first, or shred with shred_subject, which does",
        )


class KeyDestroyedError(KeyStoreError):
    """The key was destroyed; what it sealed is unreadable and it seals nothing new."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"key {key_id!r} was destroyed (the subject was shredded); its payloads are "
            "unreadable and new sealed writes for the subject are refused"
        )


class KeyStoreUnavailableError(KeyStoreError, StorageUnavailableError):
    """The key store failed with an error that is not a Loom error (a KMS or vault client
    that cannot reach its service, say); the key store's own error is the ``__cause__``.

    A :class:`~loom_core.StorageUnavailableError`, as an event store that cannot be reached
    is: the call wrote nothing to the event store, and trying again once the key store
    answers is safe (creating a subject's key is get-or-create).
    """

    def __init__(
        self,
        operation: str,
        cause: Exception,
        then: str = "nothing was written to the event store: try again once the key store "
        "answers",
    ) -> None:
        self.operation = operation
        super().__init__(
            f"the key store failed to {operation}: {type(cause).__name__}: {cause}; {then}"
        )


class PayloadAuthenticationError(LoomError):
    """A stored payload that does not authenticate for the event holding it.

    It was moved from another event (another execution, sequence, kind or incarnation),
    altered, or authenticated under a different key than its envelope names. The decorator
    hands back only payloads it wrote, so nothing is returned: the whole call raises.
    """

    def __init__(self, execution_id: str, sequence: int, key_id: str | None, reason: str) -> None:
        self.execution_id = execution_id
        self.sequence = sequence
        self.key_id = key_id
        self.reason = reason
        super().__init__(
            f"the payload of event {sequence} of {execution_id!r} does not authenticate: "
            f"{reason}; it was moved from another event or altered"
        )


class IncarnationMismatchError(PayloadAuthenticationError):
    """The event was written for another incarnation of its execution id than the log's
    first stored event: a row copied back from a log that was deleted and re-created (or
    rows altered). ``expected`` is the log's incarnation, ``found`` the event's (``None``:
    it carries none)."""

    def __init__(
        self, execution_id: str, sequence: int, expected: str | None, found: str | None
    ) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            execution_id, sequence, None,
            f"it belongs to incarnation {found!r} of the id, but the log's first stored event "
            f"belongs to {expected!r} (a row copied from a deleted and re-created log)",
        )


class UnauthenticatedPayloadError(PayloadAuthenticationError):
    """The payload carries no authentication the decorator accepts: plaintext with no
    MAC (a row replaced with SQL), or an event or log in format 1, written by loom-crypto
    0.1, while the decorator was opened without ``legacy_reads=True``."""


class ShredIncompleteError(LoomError):
    """``shred_subject`` destroyed nothing provable: the key store's ``was_destroyed`` is
    still false after ``destroy``. No tombstone was written; retry once the key store
    records the destruction (a KMS with a deletion window proves it only when it ends)."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"the key store cannot prove that key {key_id!r} was destroyed; no "
            "PAYLOAD_SHREDDED tombstone was written. Retry shred_subject once it can"
        )
