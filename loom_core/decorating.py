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

A decorator checks a batch once with :func:`check_batch` and passes the
:class:`CheckedEvents` it returns to the store below, which takes it as checked; events it
makes from a checked batch it builds with :meth:`CheckedEvents.with_payloads` or
:meth:`CheckedEvents.with_metadata`, which check only what is new::

    async def append(self, execution_id, events, *, expected_sequence, fence=None):
        batch = check_batch(events)
        stamped = batch.with_metadata([{"tenant": self.tenant}] * len(batch))
        return await self.inner.append(
            execution_id, stamped, expected_sequence=expected_sequence, fence=fence
        )

The contract a decorator wraps, and the checks it runs on its own arguments, are in
:mod:`loom_core.spi` (with :class:`~loom_core.spi.PluginHost`, to load a plugin in a test).
Prove a decorator with ``loom_conformance.decorating`` (docs/plugin-authors.md).
Everything here is public; the modules it comes from are not.
"""

from loom_core.checked import CheckedEvents
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
from loom_core.validation import check_batch

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
    # checking a batch once per stack
    "CheckedEvents",
    "check_batch",
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
