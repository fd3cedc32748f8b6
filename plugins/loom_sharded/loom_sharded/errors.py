"""Errors the sharded decorator adds to the Loom tree::

    LoomError
    ├── InvalidInputError
    │   ├── CrossShardError             a multi-id call whose ids live on different shards
    │   └── InvalidOptionError
    │       └── ShardLayoutChangedError  .shard, .reason: opened in another layout than
    │                                    the one its data was written in
    └── StorageError
        └── StorageUnavailableError
            └── ShardUnavailableError   .shard (index, name, url), .execution_id
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from loom_core.errors import InvalidInputError, InvalidOptionError, StorageUnavailableError

__all__ = [
    "CrossShardError",
    "Shard",
    "ShardLayoutChangedError",
    "ShardUnavailableError",
    "redact_url",
]


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, fit for an error message."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))
    except ValueError:
        return "<unparsable URL>"


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard as errors name it: its position, its routing name and its (redacted) URL."""

    index: int
    name: str
    url: str

    def __str__(self) -> str:
        where = f", {self.url}" if self.url else ""
        return f"shard {self.index} ({self.name}{where})"


class ShardUnavailableError(StorageUnavailableError):
    """The shard that owns the execution (or lease key) failed; other shards are unaffected.

    ``__cause__`` is the shard's own error. Retry later, or restore the shard; executions
    owned by the other shards keep working meanwhile.
    """

    def __init__(self, shard: Shard, execution_id: str | None, cause: BaseException) -> None:
        self.shard = shard
        self.execution_id = execution_id
        self.cause = cause
        subject = f" for {execution_id!r}" if execution_id is not None else ""
        super().__init__(
            f"{shard} is unavailable{subject}: {type(cause).__name__}: {cause}; only the "
            "executions that shard owns are affected, the other shards keep working"
        )


class CrossShardError(InvalidInputError):
    """A call that must be atomic over several ids whose owning shards differ.

    ``placement`` maps each id to the index of its shard. Nothing was written.
    """

    def __init__(self, method: str, placement: Mapping[str, int], why: str) -> None:
        self.method = method
        self.placement = dict(placement)
        by_shard: dict[int, list[str]] = {}
        for execution_id, index in self.placement.items():
            by_shard.setdefault(index, []).append(execution_id)
        where = "; ".join(
            f"shard {index}: {', '.join(repr(i) for i in ids)}"
            for index, ids in sorted(by_shard.items())
        )
        super().__init__(f"{method} spans several shards ({where}): {why}")


class ShardLayoutChangedError(InvalidOptionError):
    """The shards were opened in another layout than the one their data was written in.

    Routing depends on the shard names (positions, for default names) and ``colocate``;
    opened differently, existing executions would be looked for on shards that do not hold
    them. ``shard`` is the shard whose record disagrees, ``reason`` what changed. Nothing
    was written; reopen with the recorded layout (docs/sharded.md, "Changing the layout").
    """

    def __init__(self, shard: Shard, reason: str, remedy: str) -> None:
        self.shard = shard
        self.reason = reason
        super().__init__(
            f"the shard layout changed: {shard}: {reason}; {remedy}"
        )
