"""Plugin discovery (entry-point group ``loom``) and :func:`open_storage`.

Each plugin is loaded and asked to register on its own: a plugin that fails to import or
raises while registering is reported by name in :attr:`PluginHost.errors` (and in the
error for a URL it would have served), and the other plugins keep working.

:func:`open_storage` is public from :mod:`loom_core`, :data:`DecoratorSpec` from
:mod:`loom_core.decorating`. :class:`PluginHost` and :func:`default_plugins` are public
from :mod:`loom_core.spi`, not the top level: a user never needs them, while every
plugin's tests and the tools that choose their plugins (the conformance kit, the bench)
do, whichever kind of plugin it is. This module's name is private.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import re
import threading
import warnings
from collections.abc import Generator, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, TypeAlias, final
from urllib.parse import urlsplit

import pluggy

from loom_core.errors import (
    DuplicateRegistrationError,
    InvalidOptionError,
    InvalidURLError,
    LoomError,
    PluginError,
    PluginLoadError,
    UnknownSchemeError,
)
from loom_core.hookspecs import PROJECT, LoomHookSpecs
from loom_core.registry import (
    BackendFactory,
    BackendRegistry,
    DecoratorRegistry,
    StorageDecorator,
)
from loom_core.storage import Storage

__all__ = ["DecoratorSpec", "PluginHost", "default_plugins", "open_storage"]

_KNOWN_DISTRIBUTIONS: Final = {
    "sqlite": "loom-sqlite",
    "postgresql": "loom-postgres",
    "postgres": "loom-postgres",
}
_KNOWN_DECORATORS: Final = {
    "tenant": "loom-tenant",
    "sharded": "loom-sharded",
    "crypto": "loom-crypto",
    "audit": "loom-audit",
}

def _install_hint(distribution: str) -> str:
    """How to install one of Loom's own distributions, which are installed from a checkout
    of its repository (nothing is on the package index yet)."""
    folder = distribution.replace("-", "_")
    return (
        f"the {distribution} distribution (from a checkout of Loom's repository: "
        f"pip install ./plugins/{folder})"
    )


DecoratorSpec: TypeAlias = str | tuple[str, Mapping[str, object]]
"""A decorator by registered name, optionally with its options."""


@final
class PluginHost:
    """The plugins of one process: a pluggy manager plus the registries they filled.

    ``PluginHost()`` discovers the ``loom`` entry points; ``PluginHost(entry_points=False)``
    starts with only the built-in memory backend, and tests add plugins with
    :meth:`register`.
    """

    __slots__ = ("_backends", "_decorators", "_dirty", "_sources", "errors", "manager")

    def __init__(self, *, entry_points: bool = True) -> None:
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(LoomHookSpecs)
        self.errors: list[PluginError] = []
        self._sources: dict[str, str] = {}
        self._dirty = True
        self._backends = BackendRegistry()
        self._decorators = DecoratorRegistry()
        from loom_core.memory import plugin as memory_plugin

        self.register(memory_plugin, name="memory", source="loom-core (built in)")
        if entry_points:
            self._load_entry_points()

    def _load_entry_points(self) -> None:
        for ep in importlib.metadata.entry_points(group=PROJECT):
            distribution = ep.dist.name if ep.dist is not None else None
            if ep.name in self._sources:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not take the others down
                self._fail(PluginLoadError(ep.name, distribution, exc))
                continue
            self.register(plugin, name=ep.name, source=distribution or ep.value)

    def register(self, plugin: object, *, name: str, source: str | None = None) -> None:
        """Add a plugin in-process (as an entry point would)."""
        unmarked = _unmarked_hooks(plugin)
        if unmarked:
            # pluggy skips a function that lacks the marker, so the plugin would register
            # nothing and the user would meet only an unknown scheme.
            self._fail(PluginLoadError(name, source, PluginError(
                f"{', '.join(unmarked)} is not marked as a hook implementation: decorate "
                "it with @hookimpl (from loom_core.spi, or loom_core.decorating)"
            )))
            return
        try:
            self.manager.register(plugin, name=name)
        except Exception as exc:
            self._fail(PluginLoadError(name, source, exc))
            return
        try:
            # A hook implementation no spec knows (a misspelled hook name) would otherwise
            # register nothing and say nothing.
            self.manager.check_pending()
        except pluggy.PluginValidationError as exc:
            self.manager.unregister(name=name)
            self._fail(PluginLoadError(name, source, exc))
            return
        self._sources[name] = source or name
        self._dirty = True

    def _fail(self, error: PluginError) -> None:
        self.errors.append(error)
        warnings.warn(str(error), RuntimeWarning, stacklevel=3)

    def _collect(self) -> None:
        if not self._dirty:
            return
        backends, decorators = BackendRegistry(), DecoratorRegistry()
        errors = [e for e in self.errors if not isinstance(e, DuplicateRegistrationError)]
        for hook_name, registry in (
            ("loom_register_backends", backends),
            ("loom_register_decorators", decorators),
        ):
            caller = getattr(self.manager.hook, hook_name)
            # Oldest registration first, so the first source named in a conflict is the
            # one that registered first.
            for impl in reversed(caller.get_hookimpls()):
                source = self._sources.get(impl.plugin_name, impl.plugin_name)
                registry._source = source
                try:
                    impl.function(registry=registry)
                except DuplicateRegistrationError as exc:
                    errors.append(exc)
                except Exception as exc:
                    errors.append(PluginLoadError(impl.plugin_name, source, exc))
        self._backends, self._decorators = backends, decorators
        self.errors = errors
        self._dirty = False

    @property
    def backends(self) -> BackendRegistry:
        self._collect()
        return self._backends

    @property
    def decorators(self) -> DecoratorRegistry:
        self._collect()
        return self._decorators

    @staticmethod
    def backend_distribution(scheme: str) -> str | None:
        """The Loom distribution that serves the URL scheme ``scheme`` (what to ``pip
        install``), or None for a scheme only a third-party plugin could serve."""
        return _KNOWN_DISTRIBUTIONS.get(scheme)

    @staticmethod
    def decorator_distribution(name: str) -> str | None:
        """The Loom distribution that provides the decorator ``name``, or None."""
        return _KNOWN_DECORATORS.get(name)

    def _blame(self, name: str) -> LoomError | None:
        """The recorded error that explains why ``name`` is missing or ambiguous."""
        for registry in (self._backends, self._decorators):
            if name in registry.conflicts:
                return registry.conflicts[name]
        for error in self.errors:
            if isinstance(error, PluginLoadError) and error.plugin == name:
                return error
        return None

    def _failures(self) -> str | None:
        """Every plugin that failed to load, for an error about a name none of the loaded
        plugins serves: a plugin's name (its entry point's) need not be the scheme or
        decorator it would have registered, so any of them may be the one missing."""
        failed = [str(e) for e in self.errors if isinstance(e, PluginLoadError)]
        if not failed:
            return None
        return f"plugins that failed to load (one of them may provide it): {'; '.join(failed)}"

    def backend_for(self, scheme: str) -> BackendFactory:
        """The factory registered for ``scheme``; UnknownSchemeError naming the installed
        schemes (and what to install) when none is."""
        registry = self.backends
        blame = self._blame(scheme)
        if isinstance(blame, DuplicateRegistrationError):
            raise blame
        factory = registry.factories.get(scheme)
        if factory is None:
            hint = None
            if blame is not None:
                hint = f"the plugin that serves it failed to load: {blame}"
            else:
                hints = []
                if (distribution := self.backend_distribution(scheme)) is not None:
                    hints.append(f"install it: {_install_hint(distribution)}")
                if (failures := self._failures()) is not None:
                    hints.append(failures)
                hint = "; ".join(hints) or None
            raise UnknownSchemeError(scheme, registry.factories, hint)
        return factory

    def decorator(self, name: str) -> StorageDecorator:
        registry = self.decorators
        blame = self._blame(name)
        if isinstance(blame, DuplicateRegistrationError):
            raise blame
        decorator = registry.decorators.get(name)
        if decorator is None:
            installed = ", ".join(sorted(registry.decorators)) or "(none)"
            message = f"no decorator named {name!r} is installed; installed: {installed}"
            if blame is not None:
                message += f"; the plugin that provides it failed to load: {blame}"
            else:
                if (distribution := self.decorator_distribution(name)) is not None:
                    message += f"; install it: {_install_hint(distribution)}"
                if (failures := self._failures()) is not None:
                    message += f"; {failures}"
            raise InvalidOptionError(message)
        return decorator


_HOOK_NAMES: Final = tuple(
    name for name in vars(LoomHookSpecs) if name.startswith(f"{PROJECT}_")
)


def _unmarked_hooks(plugin: object) -> list[str]:
    """The hooks ``plugin`` defines by name but without the ``@hookimpl`` marker."""
    return [
        name for name in _HOOK_NAMES
        if callable(getattr(plugin, name, None))
        and not hasattr(getattr(plugin, name), f"{PROJECT}_impl")
    ]


_default: PluginHost | None = None
_default_lock: Final = threading.RLock()  # a plugin may ask for the host as it loads


def default_plugins() -> PluginHost:
    """The process-wide host, discovering entry points on first use."""
    global _default
    if _default is None:
        with _default_lock:  # the first open_storage discovers them in a thread
            if _default is None:
                _default = PluginHost()
    return _default


def _scheme(url: object) -> str:
    if not isinstance(url, str):
        raise InvalidURLError(f"storage URL must be a str, not {type(url).__name__}")
    if "://" not in url:
        raise InvalidURLError(
            f"storage URL {_masked(url)!r} has no scheme followed by '://'; use e.g. memory://, "
            "sqlite:///path/loom.db (three slashes before a relative path, four before an "
            "absolute one) or postgresql://user@host/db"
        )
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:
        raise InvalidURLError(
            f"storage URL {_masked(url)!r} cannot be parsed: {exc}"
        ) from None
    if not scheme:
        raise InvalidURLError(f"storage URL {_masked(url)!r} has no scheme")
    return scheme.lower()


_PASSWORD: Final = re.compile(r"([^:/@\s]*:)[^@/\s]*@")


def _masked(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part, if any, masked: a URL
    refused for its shape is shown in the error, and errors reach logs."""
    return _PASSWORD.sub(r"\1***@", url)


def _decorator_specs(
    decorators: Sequence[DecoratorSpec],
) -> list[tuple[str, Mapping[str, object]]]:
    if isinstance(decorators, str) or not isinstance(decorators, Sequence):
        raise InvalidOptionError(
            "decorators must be a list of names or (name, options) pairs, innermost first"
        )
    specs: list[tuple[str, Mapping[str, object]]] = []
    for spec in decorators:
        if isinstance(spec, str):
            specs.append((spec, {}))
        elif (
            isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str)
            and isinstance(spec[1], Mapping)
        ):
            specs.append((spec[0], spec[1]))
        else:
            raise InvalidOptionError(
                f"decorator {spec!r} must be a name or a (name, options) pair"
            )
    return specs


async def _open(
    url: str,
    decorators: Sequence[DecoratorSpec],
    options: Mapping[str, object] | None,
    plugins: PluginHost | None,
) -> Storage:
    if options is not None and not isinstance(options, Mapping):
        raise InvalidOptionError(f"options must be a mapping, not {type(options).__name__}")
    if plugins is not None:
        host = plugins
    elif _default is not None:
        host = _default
    else:
        # Discovering the entry points imports every installed plugin (a driver, its
        # C extension): seconds on a slow disk, not to be spent on the event loop.
        host = await asyncio.to_thread(default_plugins)
    scheme = _scheme(url)
    specs = _decorator_specs(decorators)
    chosen = [(host.decorator(name), opts) for name, opts in specs]
    factory = host.backend_for(scheme)
    storage = await _made(
        factory(url, dict(options or {})), f"the backend factory of {scheme}://", None
    )
    try:
        for decorator, opts in chosen:
            storage = await _made(
                decorator.decorate(storage, opts),
                f"decorate() of the decorator {decorator.name!r}",
                storage,
            )
    except BaseException:
        await storage.close()
        raise
    return storage


async def _made(made: object, maker: str, given: Storage | None) -> Storage:
    """The storage a backend factory or a decorator's ``decorate`` made; refuse, naming
    the maker, a result that is not awaitable or not a :class:`Storage` (a plugin's bug:
    the caller would meet it only as an AttributeError far from its cause)."""
    if not inspect.isawaitable(made):
        if isinstance(made, Storage) and made is not given:
            await made.close()
        raise PluginError(
            f"{maker} returned a {type(made).__name__}, not an awaitable: define it with "
            "async def"
        )
    storage = await made
    if not isinstance(storage, Storage):
        raise PluginError(
            f"{maker} returned a {type(storage).__name__}, not a loom_core.Storage: return "
            "Storage(events, timers, leases, url=..., on_close=...)"
        )
    return storage


@final
class _Opening:
    """``await open_storage(...)`` or ``async with open_storage(...) as storage``."""

    __slots__ = ("_args", "_storage")

    def __init__(self, *args: Any) -> None:
        self._args = args
        self._storage: Storage | None = None

    def __await__(self) -> Generator[Any, None, Storage]:
        return _open(*self._args).__await__()

    def __repr__(self) -> str:
        # What asyncio.run(open_storage(url)) prints in its "a coroutine was expected" error.
        url = self._args[0]
        shown = _masked(url) if isinstance(url, str) else url
        return (
            f"open_storage({shown!r}), which is not a coroutine: inside an async "
            "function, `await open_storage(...)` or `async with open_storage(...) as "
            "storage:`, and pass that function's coroutine to asyncio.run"
        )

    async def __aenter__(self) -> Storage:
        self._storage = await _open(*self._args)
        return self._storage

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._storage is not None:
            await self._storage.close()


def open_storage(
    url: str,
    *,
    decorators: Sequence[DecoratorSpec] = (),
    options: Mapping[str, object] | None = None,
    plugins: PluginHost | None = None,
) -> _Opening:
    """Open the :class:`Storage` for ``url``, wrapped by ``decorators`` (innermost first).

    ``memory://`` is built in; ``sqlite:///path`` and ``postgresql://…`` need their
    plugins installed, and any scheme a third-party plugin registers works the same way.
    An unknown scheme raises :class:`~loom_core.errors.UnknownSchemeError` listing the
    installed schemes and, for a known one, the distribution to install.
    """
    return _Opening(url, decorators, options, plugins)
