"""loom-crypto: payloads sealed with AES-256-GCM under per-subject keys, and
crypto-shredding of a subject.

Open it over any store, the audit chain below it (``decorators`` are innermost first)::

    from loom_core import open_storage
    from loom_crypto import FileKeyStore, shred_subject

    keys = FileKeyStore("/var/lib/myapp/loom-keys")        # never inside the database
    storage = await open_storage(
        "sqlite:///var/lib/myapp/loom.db",
        decorators=["audit", ("crypto", {"key_store": keys,
                                         "subject_of": lambda eid, ev: customer_of(eid)})],
    )
    ...
    await shred_subject(storage, "customer-42")
"""

from loom_crypto.errors import (
    IncarnationMismatchError,
    KeyDestroyedError,
    KeyNotFoundError,
    KeyOutOfScopeError,
    KeyStoreError,
    KeyStoreUnavailableError,
    PayloadAuthenticationError,
    ShredIncompleteError,
    UnauthenticatedPayloadError,
)
from loom_crypto.file_keystore import FileKeyStore
from loom_crypto.keys import KEY_BYTES, DataKey, KeyStore
from loom_crypto.memory_keystore import MemoryKeyStore
from loom_crypto.plugin import CryptoDecorator
from loom_crypto.scoped_keystore import SCOPE_PREFIX, ScopedKeyStore
from loom_crypto.sealing import (
    CLEAR_MARKER,
    FORMAT_VERSION,
    INCARNATION_FIELD,
    INTEGRITY_SUBJECT,
    MAX_SEALS_PER_KEY,
    SEALED_MARKER,
)
from loom_crypto.shredding import ShredResult, find_crypto_store, shred_subject
from loom_crypto.store import CryptoEventStore, SubjectOf, subject_is_execution

__version__ = "0.1.0"

__all__ = [
    "CLEAR_MARKER",
    "FORMAT_VERSION",
    "INCARNATION_FIELD",
    "INTEGRITY_SUBJECT",
    "KEY_BYTES",
    "MAX_SEALS_PER_KEY",
    "SCOPE_PREFIX",
    "SEALED_MARKER",
    "CryptoDecorator",
    "CryptoEventStore",
    "DataKey",
    "FileKeyStore",
    "IncarnationMismatchError",
    "KeyDestroyedError",
    "KeyNotFoundError",
    "KeyOutOfScopeError",
    "KeyStore",
    "KeyStoreError",
    "KeyStoreUnavailableError",
    "MemoryKeyStore",
    "PayloadAuthenticationError",
    "ScopedKeyStore",
    "ShredIncompleteError",
    "ShredResult",
    "SubjectOf",
    "UnauthenticatedPayloadError",
    "__version__",
    "find_crypto_store",
    "shred_subject",
    "subject_is_execution",
]
