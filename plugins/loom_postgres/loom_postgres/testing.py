"""Test-only switches. Never use them in production: they remove a guarantee on purpose,
so a test can show that it catches the violation."""

from __future__ import annotations

from loom_core.spi import EventStore
from loom_postgres.events import PostgresEventStore

__all__ = ["disable_answering_lock"]


def disable_answering_lock(store: EventStore) -> None:
    """Make ``store``'s answering appends skip the fence row's FOR SHARE read (ADR 0118
    D1) on both append paths: the race with ``acquire_fence_if`` is then open again."""
    if not isinstance(store, PostgresEventStore):
        raise TypeError(f"disable_answering_lock needs a PostgresEventStore, not {store!r}")
    store._answering_lock = False
