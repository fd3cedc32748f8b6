"""Decorator stacks: which are installed, and the options each needs to be opened.

A stack is a list of registered decorator names, innermost first (``crypto+audit`` puts
the chain over the ciphertext). Options come from each decorator's own
``conformance_options`` (the hook a decorator already provides so that any store can be
wrapped with no configuration), with one exception: ``sharded`` gets exactly one more
database of the backend under test, so the row reads "sharded over two databases".
Extra databases are opened with the backend's own options and closed after the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from loom_bench.backends import Backend
from loom_core import Storage, open_storage
from loom_core.decorating import DecoratorSpec
from loom_core.spi import PluginHost

__all__ = ["StackOpening", "missing_decorator", "parse_stack"]

SHARDED: Final = "sharded"


def parse_stack(text: str) -> tuple[str, ...]:
    """``"crypto+audit"`` → ``("crypto", "audit")``; refuses an empty name."""
    names = tuple(part.strip() for part in text.split("+"))
    if not text.strip() or any(not name for name in names):
        raise ValueError(f"stack {text!r} must be decorator names joined by '+'")
    return names


def missing_decorator(stack: Sequence[str], plugins: PluginHost) -> str | None:
    """Why ``stack`` cannot be opened here ("not installed: …"), or None."""
    installed = plugins.decorators.decorators
    for name in stack:
        if name not in installed:
            hint = plugins.decorator_distribution(name)
            install = f" (pip install {hint})" if hint else ""
            return f"decorator {name!r} not installed{install}"
    return None


class StackOpening:
    """The decorator specs of one run's stack, and the extra storages they hold."""

    __slots__ = ("_backend", "_opened", "_plugins", "_tag")

    def __init__(self, backend: Backend, tag: str, plugins: PluginHost) -> None:
        self._backend = backend
        self._tag = tag
        self._plugins = plugins
        self._opened: list[Storage] = []

    async def _open_inner(self) -> Storage:
        url = await self._backend.extra_url(self._tag, len(self._opened) + 1)
        storage = await open_storage(
            url, options=self._backend.options, plugins=self._plugins
        )
        self._opened.append(storage)
        return storage

    async def specs(self, stack: Sequence[str]) -> list[DecoratorSpec]:
        specs: list[DecoratorSpec] = []
        for name in stack:
            if name == SHARDED:
                specs.append((name, {"shards": [await self._open_inner()]}))
            else:
                decorator = self._plugins.decorator(name)
                specs.append((name, await decorator.conformance_options(self._open_inner)))
        return specs

    async def close(self) -> None:
        """Close every extra storage (closing twice is harmless)."""
        for storage in self._opened:
            await storage.close()
        self._opened.clear()
