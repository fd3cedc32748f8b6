"""A durable, file-backed :class:`~loom_crypto.KeyStore` in a directory of its own.

Layout (the directory is created 0700, every file 0600; a directory that already exists
and that its group or others may write to is refused)::

    <dir>/subjects/<sha256(subject)>   {"v": 1, "kid": "<key id>"}           the claim
    <dir>/keys/<key id>.json           {"v": 1, "kid", "state": "live", "key": b64}
                                       {"v": 1, "kid", "state": "destroyed", "destroyed_at"}

Every write is a temporary file, ``fsync``, then an atomic ``link`` (a claim: exactly one
process wins a subject) or ``rename`` (a destroy), then an ``fsync`` of the directory, so a
crash leaves either the old record or the new one, never half of one. Destroying rewrites
the key's record as a tombstone without its bytes; the tombstone is what
:meth:`FileKeyStore.was_destroyed` reads, so destruction stays provable after a restart.

Keep the directory **outside** the event database and outside its backup set: a key
backup that outlives ``shred_subject`` resurrects what it shredded.
Erasure here is a file rewrite: the filesystem may keep the old bytes in free blocks until
they are reused, so put the directory on an encrypted volume, or use a KMS or HSM when a
destroyed key must be unrecoverable from the disk itself. Subject names are stored only as
SHA-256 digests, which hides them from a casual reader but not from someone who can guess
them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from loom_core.errors import InvalidOptionError, StorageReadError, StorageWriteError
from loom_core.spi import check_key
from loom_crypto.errors import KeyDestroyedError, KeyNotFoundError
from loom_crypto.keys import KEY_BYTES, DataKey

__all__ = ["FileKeyStore"]

_KEY_ID: Final = re.compile(r"[0-9a-f]{32}")
_FORMAT: Final = 1


@dataclass(frozen=True, slots=True, repr=False)
class _Record:
    key_id: str
    material: bytes | None  # None: destroyed


class FileKeyStore:
    """Keys in ``directory``, shared safely by every process that opens the same one."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        if not isinstance(directory, str | os.PathLike):
            raise InvalidOptionError(
                f"FileKeyStore takes a directory path, not {type(directory).__name__}"
            )
        self._root = Path(directory)
        self._subjects = self._root / "subjects"
        self._keys = self._root / "keys"
        try:
            for path in (self._root, self._subjects, self._keys):
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageWriteError(f"cannot create key directory {self._root}: {exc}") from exc
        for path in (self._root, self._subjects, self._keys):
            _refuse_shared(path)

    @property
    def directory(self) -> Path:
        return self._root

    def __repr__(self) -> str:
        return f"FileKeyStore({str(self._root)!r})"

    # -- KeyStore ------------------------------------------------------------------------

    async def create(self, subject: str) -> DataKey:
        subject = check_key(subject, "subject")
        return await asyncio.to_thread(self._create, subject)

    async def get(self, key_id: str) -> DataKey:
        key_id = check_key(key_id, "key id")
        return await asyncio.to_thread(self._get, key_id)

    async def key_id_for(self, subject: str) -> str | None:
        subject = check_key(subject, "subject")
        return await asyncio.to_thread(self._claimed, subject)

    async def destroy(self, key_id: str) -> bool:
        key_id = check_key(key_id, "key id")
        return await asyncio.to_thread(self._destroy, key_id)

    async def was_destroyed(self, key_id: str) -> bool:
        key_id = check_key(key_id, "key id")
        return await asyncio.to_thread(self._was_destroyed, key_id)

    # -- blocking work, run in a thread ---------------------------------------------------

    def _create(self, subject: str) -> DataKey:
        key_id = self._claimed(subject)
        if key_id is not None:
            return self._get(key_id)
        key_id = secrets.token_hex(16)
        material = secrets.token_bytes(KEY_BYTES)
        # The key record first, then the claim: a crash in between leaves an unused key
        # record that no payload was ever sealed under, never a claim without its key.
        if not self._publish(self._key_path(key_id), _live(key_id, material), exclusive=True):
            raise StorageWriteError(f"key id {key_id!r} collided in {self._keys}; retry")
        claim = {"v": _FORMAT, "kid": key_id}
        if self._publish(self._subject_path(subject), claim, exclusive=True):
            return DataKey(key_id, material)
        # Another process claimed the subject first: use its key, drop ours.
        self._remove(self._key_path(key_id))
        winner = self._claimed(subject)
        if winner is None:
            raise StorageReadError(f"subject claim in {self._subjects} vanished while reading it")
        return self._get(winner)

    def _get(self, key_id: str) -> DataKey:
        record = self._record(key_id)
        if record is None:
            raise KeyNotFoundError(key_id)
        if record.material is None:
            raise KeyDestroyedError(key_id)
        return DataKey(key_id, record.material)

    def _destroy(self, key_id: str) -> bool:
        record = self._record(key_id)
        if record is None:
            raise KeyNotFoundError(key_id)
        if record.material is None:
            return False
        tombstone = {
            "v": _FORMAT,
            "kid": key_id,
            "state": "destroyed",
            "destroyed_at": datetime.now(UTC).isoformat(),
        }
        path = self._key_path(key_id)
        self._publish(path, tombstone, exclusive=False)
        # A process killed between writing a temporary copy and linking it leaves that copy
        # behind, key bytes included: it goes with the key.
        for stray in path.parent.glob(f".{path.name}.*.tmp"):
            self._remove(stray)
        return True

    def _was_destroyed(self, key_id: str) -> bool:
        record = self._record(key_id)
        return record is not None and record.material is None

    # -- files ---------------------------------------------------------------------------

    def _subject_path(self, subject: str) -> Path:
        return self._subjects / hashlib.sha256(subject.encode("utf-8")).hexdigest()

    def _key_path(self, key_id: str) -> Path:
        return self._keys / f"{key_id}.json"

    def _claimed(self, subject: str) -> str | None:
        data = self._load(self._subject_path(subject))
        if data is None:
            return None
        key_id = data.get("kid")
        if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
            raise StorageReadError(f"subject claim for {subject!r} in {self._subjects} is corrupt")
        return key_id

    def _record(self, key_id: str) -> _Record | None:
        # The id comes from the log, which is not trusted to name a path.
        if not _KEY_ID.fullmatch(key_id):
            return None
        path = self._key_path(key_id)
        data = self._load(path)
        if data is None:
            return None
        state = data.get("state")
        if data.get("kid") != key_id or state not in ("live", "destroyed"):
            raise StorageReadError(f"key record {path} is corrupt")
        if state == "destroyed":
            return _Record(key_id, None)
        encoded = data.get("key")
        try:
            material = base64.b64decode(str(encoded), validate=True)
        except (binascii.Error, ValueError):
            material = b""
        if len(material) != KEY_BYTES:
            raise StorageReadError(f"key record {path} is corrupt")
        return _Record(key_id, material)

    def _load(self, path: Path) -> dict[str, object] | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageReadError(f"cannot read {path}: {exc}") from exc
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("v") != _FORMAT:
            raise StorageReadError(f"{path} is not a loom-crypto key file (format {_FORMAT})")
        return data

    def _publish(self, path: Path, data: dict[str, object], *, exclusive: bool) -> bool:
        """Write ``data`` to ``path`` durably; with ``exclusive``, only if ``path`` does not
        exist yet (False if it did). The temporary file never outlives the call."""
        temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        body = json.dumps(data, separators=(",", ":")).encode("utf-8")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                if exclusive:
                    os.link(temp, path)
                else:
                    os.replace(temp, path)
            except FileExistsError:
                return False
            finally:
                self._remove(temp)
            _fsync_directory(path.parent)
        except OSError as exc:
            raise StorageWriteError(f"cannot write {path} durably: {exc}") from exc
        return True

    def _remove(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageWriteError(f"cannot remove {path}: {exc}") from exc


def _refuse_shared(directory: Path) -> None:
    """Refuse a key directory that others may write to (one that existed before, with a
    looser mode than the 0700 this store creates): whoever can add or rename files there
    can plant a subject's claim naming a key they know, and the store would seal with it."""
    try:
        mode = stat.S_IMODE(directory.stat().st_mode)
    except OSError as exc:
        raise StorageReadError(f"cannot inspect key directory {directory}: {exc}") from exc
    if mode & 0o022:
        raise InvalidOptionError(
            f"key directory {directory} is writable by its group or by others (mode "
            f"{mode:04o}): anyone who can write there can plant a key this store would seal "
            f"with; make it private (chmod 700 {directory}) or use a new directory"
        )


def _live(key_id: str, material: bytes) -> dict[str, object]:
    return {
        "v": _FORMAT,
        "kid": key_id,
        "state": "live",
        "key": base64.b64encode(material).decode("ascii"),
        "created_at": datetime.now(UTC).isoformat(),
    }


def _fsync_directory(directory: Path) -> None:
    # Makes the new directory entry (the link or rename) itself durable.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
