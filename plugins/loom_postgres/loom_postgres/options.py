"""The options of a PostgreSQL storage, checked once when it opens."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Final

from loom_core.errors import InvalidOptionError

__all__ = ["PostgresOptions", "parse_options"]

_SCHEMA: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")

Warn = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """What ``open_storage("postgresql://…", options={...})`` accepts.

    * ``pool_min_size`` / ``pool_max_size``: the one pool every store shares. Budget
      ``pool_max_size + 1`` connections per node (the extra one is the LISTEN connection,
      opened on the first ``subscribe``).
    * ``schema``: put every table in this schema (created if missing); default: the
      connection's search_path. Lowercase letters, digits and ``_`` only.
    * ``notify_buckets``: LISTEN/NOTIFY channels executions are hashed over; must be the
      same on every node of the database. 0 turns cross-node wake-ups off (a subscriber
      then finds events by polling every ``subscribe_poll_interval``).
    * ``notify_queue_limit``: above this fraction of the server's NOTIFY queue an append
      skips its wake-up instead of risking a failed commit (see docs/postgres.md).
    * ``backfill_park_fences``: accepted and ignored since schema 3 (parks need no fence
      row any more, so there is nothing to backfill); kept so existing configurations
      still open.
    * ``migrate``: create or migrate the schema on open (else refuse an old schema).
    * ``migration_lock_timeout``: seconds a boot waits for a table lock while migrating.
    * ``lock_timeout``: seconds any store statement waits for a row lock (None: the
      server's setting) before :class:`~loom_postgres.LockTimeoutError`.
    * ``max_batch`` / ``max_inflight_batches``: group commit: at most this many writes
      share one round-trip and commit, and at most this many such commits are in flight.
    * ``reconnect_timeout``: seconds an operation keeps retrying while the server is
      unreachable (a restart) before it raises.
    * ``subscribe_poll_interval``: seconds a live subscriber waits for a wake-up before
      re-reading anyway (a safety net for a skipped or lost NOTIFY).
    * ``on_warn``: called with a message for degraded-but-working conditions (skipped
      wake-ups), at most once a minute per condition. Default: ``warnings.warn``.
    """

    pool_min_size: int = 2
    pool_max_size: int = 10
    schema: str | None = None
    notify_buckets: int = 16
    notify_queue_limit: float = 0.5
    backfill_park_fences: bool = True
    migrate: bool = True
    migration_lock_timeout: float = 10.0
    lock_timeout: float | None = None
    max_batch: int = 256
    max_inflight_batches: int = 2
    reconnect_timeout: float = 15.0
    subscribe_poll_interval: float = 5.0
    connect_timeout: float = 10.0
    on_warn: Warn | None = None


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionError(f"option {name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise InvalidOptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _seconds(name: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptionError(
            f"option {name} must be a number of seconds, not {type(value).__name__}"
        )
    if not math.isfinite(value) or value <= 0:
        raise InvalidOptionError(f"option {name} must be finite and > 0, got {value!r}")
    return float(value)


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidOptionError(f"option {name} must be a bool, not {type(value).__name__}")
    return value


def parse_options(options: Mapping[str, object]) -> PostgresOptions:
    """Check ``options``; an unknown name or a bad value is an InvalidOptionError that
    names it."""
    if not isinstance(options, Mapping):
        raise InvalidOptionError(f"options must be a mapping, not {type(options).__name__}")
    known = {f.name for f in fields(PostgresOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidOptionError(
            f"unknown postgresql:// options {unknown}; known: {', '.join(sorted(known))}"
        )
    defaults = PostgresOptions()
    values: dict[str, object] = {}
    for name, value in options.items():
        if name in {"pool_min_size", "max_batch", "max_inflight_batches"}:
            values[name] = _int(name, value, 1)
        elif name in {"pool_max_size"}:
            values[name] = _int(name, value, 2)
        elif name == "notify_buckets":
            values[name] = _int(name, value, 0)
        elif name in {"backfill_park_fences", "migrate"}:
            values[name] = _bool(name, value)
        elif name == "lock_timeout":
            values[name] = _seconds(name, value, allow_none=True)
        elif name in {
            "migration_lock_timeout", "reconnect_timeout", "subscribe_poll_interval",
            "connect_timeout",
        }:
            values[name] = _seconds(name, value)
        elif name == "notify_queue_limit":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidOptionError("option notify_queue_limit must be a number")
            if not 0 <= value <= 1:
                raise InvalidOptionError(
                    f"option notify_queue_limit must be within [0, 1], got {value!r}"
                )
            values[name] = float(value)
        elif name == "schema":
            if value is not None and (not isinstance(value, str) or not _SCHEMA.fullmatch(value)):
                raise InvalidOptionError(
                    f"option schema must be lowercase letters, digits and '_' (at most 63, "
                    f"not starting with a digit), got {value!r}"
                )
            values[name] = value
        elif name == "on_warn":
            if value is not None and not callable(value):
                raise InvalidOptionError("option on_warn must be a callable taking a str")
            values[name] = value
    merged = {f.name: values.get(f.name, getattr(defaults, f.name)) for f in fields(defaults)}
    result = PostgresOptions(**merged)  # type: ignore[arg-type]
    if result.pool_min_size > result.pool_max_size:
        raise InvalidOptionError(
            f"option pool_min_size ({result.pool_min_size}) exceeds pool_max_size "
            f"({result.pool_max_size})"
        )
    if result.max_inflight_batches >= result.pool_max_size:
        raise InvalidOptionError(
            f"option max_inflight_batches ({result.max_inflight_batches}) must be below "
            f"pool_max_size ({result.pool_max_size}) so reads always find a connection"
        )
    return result
