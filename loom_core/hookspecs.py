"""The pluggy hooks a Loom plugin implements.

A plugin is a module (or object) named by an entry point in the ``loom`` group::

    [project.entry-points.loom]
    mystore = "mystore.plugin"

    # mystore/plugin.py
    from loom_core.spi import hookimpl

    @hookimpl
    def loom_register_backends(registry):
        registry.add_backend("mystore", open_mystore)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pluggy

if TYPE_CHECKING:
    from loom_core.registry import BackendRegistry, DecoratorRegistry

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT: Final = "loom"
hookspec: Final = pluggy.HookspecMarker(PROJECT)
hookimpl: Final = pluggy.HookimplMarker(PROJECT)


class LoomHookSpecs:
    """Hook specifications; each plugin may implement any subset."""

    @hookspec
    def loom_register_backends(self, registry: BackendRegistry) -> None:
        """Register URL schemes: ``registry.add_backend(scheme, factory)``."""

    @hookspec
    def loom_register_decorators(self, registry: DecoratorRegistry) -> None:
        """Register decorators: ``registry.add_decorator(decorator)``."""
