"""The decorator author's namespace: an event-store decorator, the plugin that applies it,
and the functions that walk a decorated stack.

The event-store decorator subclasses :class:`EventStoreDecorator` and decides each optional
method once: :data:`FORWARD` it, ``Implement`` it with the class's own method, or
``Refuse`` it with a reason::

    class Counting(EventStoreDecorator):
        async def append_many(self, requests):
            self.calls += 1
            return await self.inner.append_many(requests)

        decisions = Decisions(
            acquire_fence=FORWARD,
            acquire_fence_if=FORWARD,
            append_if_unchanged=FORWARD,
            append_many=Implement(append_many),
            delete_execution=Refuse("counting stores never delete"),
            copy_prefix=FORWARD,
            truncate_prefix_keeping=FORWARD,
            subscribe=FORWARD,
        )

A method left undecided raises :class:`DecoratorDefinitionError` when the class is
defined. The plugin is a :class:`StorageDecorator` (``name``, ``decorate``,
``conformance_options``) registered under its name::

    @hookimpl
    def loom_register_decorators(registry: DecoratorRegistry) -> None:
        registry.add_decorator(CountingDecorator())

and users apply it by name, innermost first: ``open_storage(url, decorators=["counting"])``
(each entry a :data:`DecoratorSpec`). Code that acts on one layer of a stack finds it with
:func:`find_layer` (which raises :class:`LayerBelowFanOutError` for a layer that exists
only below a fan-out), :func:`find_layers` or :func:`base_stores`, never by following
``inner``.

The contract a decorator wraps, and the checks it runs on its own arguments, are in
:mod:`loom_core.spi` (with :class:`~loom_core.spi.PluginHost`, to load a plugin in a test).
Prove a decorator with ``loom_conformance.decorating`` (docs/plugin-authors.md).
Everything here is public; the modules it comes from are not.
"""

from loom_core.decisions import (
    FORWARD,
    Decision,
    Decisions,
    EventStoreDecorator,
    Forward,
    Implement,
    Refuse,
)
from loom_core.errors import DecoratorDefinitionError
from loom_core.hookspecs import hookimpl
from loom_core.plugins import DecoratorSpec
from loom_core.refusal import RefusesUnoffered
from loom_core.registry import DecoratorRegistry, InnerOpener, StorageDecorator
from loom_core.stacks import LayerBelowFanOutError, base_stores, find_layer, find_layers

__all__ = [
    # the event-store decorator
    "EventStoreDecorator",
    "Decisions",
    "Decision",
    "FORWARD",
    "Forward",
    "Implement",
    "Refuse",
    "RefusesUnoffered",
    "DecoratorDefinitionError",
    # walking a stack
    "find_layer",
    "find_layers",
    "base_stores",
    "LayerBelowFanOutError",
    # the plugin
    "StorageDecorator",
    "DecoratorRegistry",
    "DecoratorSpec",
    "InnerOpener",
    "hookimpl",
]
