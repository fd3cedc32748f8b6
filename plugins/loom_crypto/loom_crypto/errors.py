"""The errors loom-crypto adds to the kernel's tree (all are :class:`~loom_core.LoomError`).

::

    LoomError
    ├── PayloadShreddedError (loom_core)   reading a payload whose key was destroyed;
    │                                      its __cause__ is the KeyDestroyedError
    ├── KeyStoreError                      a key store refused or failed
    │   ├── KeyNotFoundError (LookupError) .key_id unknown to this key store
    │   └── KeyDestroyedError              .key_id was destroyed (shredded); proof on file
    ├── PayloadAuthenticationError         .execution_id, .sequence: a sealed payload that
    │                                      does not open for the event it sits in
    └── ShredIncompleteError               .key_id: the key store cannot prove destruction,
                                           so no PAYLOAD_SHREDDED tombstone was written

A key store that cannot make a write durable raises the kernel's
:class:`~loom_core.StorageWriteError`.
"""

from __future__ import annotations

from loom_core.errors import LoomError

__all__ = [
    "KeyDestroyedError",
    "KeyNotFoundError",
    "KeyStoreError",
    "PayloadAuthenticationError",
    "ShredIncompleteError",
]


class KeyStoreError(LoomError):
    """A key store refused the request or failed."""


class KeyNotFoundError(KeyStoreError, LookupError):
    """The key id was never created in this key store.

    Seen after a restore that brought back a key store older than the log (runbook §5):
    the log holds payloads sealed under keys this key store never had.
    """

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"key {key_id!r} is unknown to this key store; if the store was restored, it is "
            "older than the log (restore a key-store backup at least as new as the log)"
        )


class KeyDestroyedError(KeyStoreError):
    """The key was destroyed; what it sealed is unreadable and it seals nothing new."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"key {key_id!r} was destroyed (the subject was shredded); its payloads are "
            "unreadable and new sealed writes for the subject are refused"
        )


class PayloadAuthenticationError(LoomError):
    """A sealed payload that does not authenticate for the event holding it.

    It was moved from another event (another execution, sequence or kind), altered, or
    sealed under a different key than its envelope names. Nothing is returned for it.
    """

    def __init__(self, execution_id: str, sequence: int, key_id: str | None, reason: str) -> None:
        self.execution_id = execution_id
        self.sequence = sequence
        self.key_id = key_id
        self.reason = reason
        super().__init__(
            f"sealed payload of event {sequence} of {execution_id!r} does not authenticate: "
            f"{reason}; it was moved from another event or altered"
        )


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
