"""Fixtures shared by the audit tests: the throwaway PostgreSQL server of the kit, and one
database on it for the stacking tests (each test opens its own schema)."""

from __future__ import annotations

import pytest
from loom_conformance.postgres import PostgresServer, loom_postgres_server

__all__ = ["loom_postgres_server", "stack_database"]


@pytest.fixture(scope="session")
def stack_database(loom_postgres_server: PostgresServer) -> str:
    return loom_postgres_server.fresh_database("loom_stack_tests")
