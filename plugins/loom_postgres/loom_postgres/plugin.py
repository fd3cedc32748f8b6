"""Registers the ``postgresql`` and ``postgres`` URL schemes (entry-point group ``loom``)."""

from __future__ import annotations

from loom_core.spi import BackendRegistry, hookimpl
from loom_postgres.storage import SCHEMES, open_postgres

__all__ = ["loom_register_backends"]


@hookimpl
def loom_register_backends(registry: BackendRegistry) -> None:
    for scheme in SCHEMES:
        registry.add_backend(scheme, open_postgres)
