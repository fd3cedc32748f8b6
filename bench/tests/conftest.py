"""Fixtures: one throwaway PostgreSQL server per session (loom_conformance.postgres) for
eventsourcing's PostgreSQL recorders; under CI=true a missing server fails, never skips."""

from __future__ import annotations

from loom_conformance.postgres import loom_postgres_server

__all__ = ["loom_postgres_server"]
