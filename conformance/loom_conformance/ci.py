"""Whether this run is CI, where the kit fails what it would skip on a developer's machine
(a missing PostgreSQL server, a runtime suite asked for without loom-runtime)."""

from __future__ import annotations

import os

__all__ = ["in_ci"]


def in_ci() -> bool:
    """Whether this run is CI (``CI=true``): what a test needs and lacks must fail, not skip."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
