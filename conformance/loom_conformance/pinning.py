"""Pinning what a decorator writes: the rows a fixed input leaves in the store below.

A decorator that transforms what it hands down (seals, links, stamps) should pin those
rows, so that a change in how it builds them cannot change a stored byte unnoticed: with
the :mod:`secrets` draws made deterministic, write a fixed input through the decorator,
read the inner store's rows and compare their digest with one pinned in the test::

    from loom_conformance.pinning import deterministic_randomness, rows_digest

    async def test_the_rows_of_a_fixed_input_are_pinned(monkeypatch):
        deterministic_randomness(monkeypatch)
        inner = MemoryEventStore()
        await write_fixed_input(MyDecorator(inner))
        assert rows_digest(await inner.read("e")) == PINNED
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
from collections.abc import Sequence

import pytest

from loom_core import Event

__all__ = ["deterministic_randomness", "rows_digest"]


def deterministic_randomness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``secrets.token_bytes`` and ``secrets.token_hex`` return a fixed sequence
    (SHA-256 of a counter), for the rest of the test."""
    counter = itertools.count()

    def token_bytes(n: int | None = None) -> bytes:
        size = 32 if n is None else n
        seed = hashlib.sha256(f"loom-test-{next(counter)}".encode()).digest()
        return (seed * (size // len(seed) + 1))[:size]

    def token_hex(n: int | None = None) -> str:
        return token_bytes(n).hex()

    monkeypatch.setattr(secrets, "token_bytes", token_bytes)
    monkeypatch.setattr(secrets, "token_hex", token_hex)


def rows_digest(rows: Sequence[Event]) -> str:
    """SHA-256 of each row's id, sequence, kind, payload and metadata (``recorded_at`` is
    the clock's, left out), as key-sorted compact JSON."""
    table = [[e.execution_id, e.sequence, e.kind, e.payload, e.metadata] for e in rows]
    return hashlib.sha256(
        json.dumps(table, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
