"""Plugin discovery, registries and open_storage."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from loom_core import (
    InvalidOptionError,
    InvalidURLError,
    NewEvent,
    PluginError,
    PluginLoadError,
    Storage,
    StoreClosedError,
    UnknownSchemeError,
    open_storage,
)
from loom_core.decorating import DecoratorRegistry, InnerOpener, hookimpl
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore
from loom_core.spi import BackendRegistry, DuplicateRegistrationError, PluginHost


async def _open_dummy(url: str, options: Mapping[str, object]) -> Storage:
    return Storage(MemoryEventStore(), MemoryTimerStore(), MemoryLeaseStore(), url=url)


def _backend_plugin(scheme: str) -> types.SimpleNamespace:
    @hookimpl
    def loom_register_backends(registry: BackendRegistry) -> None:
        registry.add_backend(scheme, _open_dummy)

    return types.SimpleNamespace(loom_register_backends=loom_register_backends)


class Tagging:
    """A decorator that records the order it was applied in."""

    def __init__(self, name: str, log: list[str]) -> None:
        self._name = name
        self._log = log

    @property
    def name(self) -> str:
        return self._name

    async def decorate(self, storage: Storage, options: Mapping[str, object]) -> Storage:
        self._log.append(f"{self._name}:{options.get('tag', '')}")
        return storage

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {}


def _decorator_plugin(decorator: Tagging) -> types.SimpleNamespace:
    @hookimpl
    def loom_register_decorators(registry: DecoratorRegistry) -> None:
        registry.add_decorator(decorator)

    return types.SimpleNamespace(loom_register_decorators=loom_register_decorators)


async def test_memory_is_built_in_and_opens_with_await_or_async_with() -> None:
    host = PluginHost(entry_points=False)
    storage = await open_storage("memory://", plugins=host)
    await storage.events.append("e", [NewEvent("k")], expected_sequence=0)
    await storage.close()
    assert storage.closed
    async with open_storage("memory://", plugins=host) as other:
        assert await other.events.head("e") == 0  # a fresh store each time


def test_asyncio_run_of_open_storage_says_to_await_it_or_use_async_with() -> None:
    import asyncio

    opening = open_storage("memory://")
    with pytest.raises(ValueError, match="coroutine") as caught:
        asyncio.run(opening)  # type: ignore[arg-type]
    assert "async with open_storage" in str(caught.value)
    assert "await open_storage" in str(caught.value)


async def test_unknown_scheme_lists_installed_and_names_the_distribution() -> None:
    host = PluginHost(entry_points=False)
    with pytest.raises(UnknownSchemeError) as caught:
        await open_storage("postgresql://localhost/loom", plugins=host)
    assert caught.value.installed == ("memory",)
    assert "the loom-postgres distribution" in str(caught.value)
    assert "pip install ./plugins/loom_postgres" in str(caught.value)
    with pytest.raises(UnknownSchemeError, match=r"'nosuch'.*installed schemes: memory"):
        await open_storage("nosuch://x", plugins=host)


@pytest.mark.parametrize("url", ["", "memory", "/tmp/x.db", 42, None])
async def test_a_url_without_a_scheme_is_refused(url: object) -> None:
    with pytest.raises(InvalidURLError):
        await open_storage(url, plugins=PluginHost(entry_points=False))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url", ["postgresql://ops:hunter2@[::1/loom", "ops:hunter2@db.internal/loom"]
)
async def test_a_url_refused_for_its_shape_does_not_show_its_password(url: str) -> None:
    with pytest.raises(InvalidURLError) as refused:
        await open_storage(url, plugins=PluginHost(entry_points=False))
    assert "hunter2" not in str(refused.value)
    assert "ops:***@" in str(refused.value)
    assert "hunter2" not in repr(open_storage(url))  # what asyncio.run(...) would print


async def test_memory_url_with_a_path_or_unknown_option_is_refused() -> None:
    host = PluginHost(entry_points=False)
    with pytest.raises(InvalidURLError):
        await open_storage("memory://somewhere", plugins=host)
    with pytest.raises(InvalidOptionError, match="unknown memory:// options"):
        await open_storage("memory://", options={"colour": "blue"}, plugins=host)
    with pytest.raises(InvalidOptionError):
        await open_storage("memory://", options=["offer"], plugins=host)  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["memory:///", "memory:////", "MEMORY:////"])
async def test_a_memory_url_with_an_empty_path_is_refused(url: str) -> None:
    host = PluginHost(entry_points=False)
    with pytest.raises(InvalidURLError, match="use 'memory://'"):
        await open_storage(url, plugins=host)


async def test_a_memory_url_scheme_is_case_insensitive_as_for_every_backend() -> None:
    # open_storage picks the backend by the scheme in any case (sqlite takes
    # SQLITE:///loom.db): the memory backend must not then refuse the URL it was given.
    host = PluginHost(entry_points=False)
    for url in ("MEMORY://", "Memory://"):
        async with open_storage(url, plugins=host) as storage:
            await storage.events.append("e", [NewEvent("A")], expected_sequence=0)
            assert await storage.events.head("e") == 1


async def test_in_process_backend_plugin_serves_its_scheme() -> None:
    host = PluginHost(entry_points=False)
    host.register(_backend_plugin("dummy"), name="dummy", source="loom-dummy")
    async with open_storage("dummy://anything", plugins=host) as storage:
        assert storage.url == "dummy://anything"


async def test_duplicate_scheme_names_both_sources_and_spares_the_others() -> None:
    host = PluginHost(entry_points=False)
    host.register(_backend_plugin("twin"), name="first", source="loom-first")
    host.register(_backend_plugin("twin"), name="second", source="loom-second")
    with pytest.raises(DuplicateRegistrationError) as caught:
        await open_storage("twin://", plugins=host)
    assert {caught.value.first, caught.value.second} == {"loom-first", "loom-second"}
    assert "loom-first" in str(caught.value)
    assert "loom-second" in str(caught.value)
    async with open_storage("memory://", plugins=host):
        pass


async def test_a_plugin_that_raises_while_registering_is_reported_by_name() -> None:
    @hookimpl
    def loom_register_backends(registry: BackendRegistry) -> None:
        raise RuntimeError("boom")

    host = PluginHost(entry_points=False)
    host.register(
        types.SimpleNamespace(loom_register_backends=loom_register_backends),
        name="broken", source="loom-broken",
    )
    host.register(_backend_plugin("fine"), name="fine", source="loom-fine")
    async with open_storage("fine://", plugins=host):
        pass
    failures = [e for e in host.errors if isinstance(e, PluginLoadError)]
    assert [e.plugin for e in failures] == ["broken"]
    assert "loom-broken" in str(failures[0])
    assert "boom" in str(failures[0])


async def test_a_misspelled_hook_is_reported_by_plugin_and_hook() -> None:
    @hookimpl
    def loom_register_backend(registry: BackendRegistry) -> None:  # no trailing "s"
        registry.add_backend("typo", _open_dummy)

    host = PluginHost(entry_points=False)
    with pytest.warns(RuntimeWarning, match="loom_register_backend"):
        host.register(
            types.SimpleNamespace(loom_register_backend=loom_register_backend),
            name="typo-plugin", source="loom-typo",
        )
    host.register(_backend_plugin("fine"), name="fine", source="loom-fine")
    async with open_storage("fine://", plugins=host):
        pass
    failures = [e for e in host.errors if isinstance(e, PluginLoadError)]
    assert [e.plugin for e in failures] == ["typo-plugin"]
    assert "loom-typo" in str(failures[0])
    assert "loom_register_backend" in str(failures[0])
    assert "typo" not in host.backends.factories


async def test_a_hook_without_the_hookimpl_marker_is_reported_not_skipped() -> None:
    def loom_register_backends(registry: BackendRegistry) -> None:  # no @hookimpl
        registry.add_backend("unmarked", _open_dummy)

    host = PluginHost(entry_points=False)
    with pytest.warns(RuntimeWarning, match="decorate it with @hookimpl"):
        host.register(
            types.SimpleNamespace(loom_register_backends=loom_register_backends),
            name="loom-unmarked", source="loom-unmarked",
        )
    [failure] = [e for e in host.errors if isinstance(e, PluginLoadError)]
    assert failure.plugin == "loom-unmarked"
    assert "loom_register_backends" in str(failure)
    with pytest.raises(UnknownSchemeError, match="not marked as a hook implementation"):
        await open_storage("unmarked://", plugins=host)


async def test_an_unknown_scheme_names_the_plugins_that_failed_whatever_their_names() -> None:
    @hookimpl
    def loom_register_backends(registry: BackendRegistry) -> None:
        raise ModuleNotFoundError("No module named 'jsonl_driver'")

    host = PluginHost(entry_points=False)
    host.register(
        types.SimpleNamespace(loom_register_backends=loom_register_backends),
        name="loom-jsonl", source="loom-jsonl",  # not the scheme it would register
    )
    with pytest.raises(UnknownSchemeError) as caught:
        await open_storage("jsonl:///tmp/x", plugins=host)
    assert "plugin 'loom-jsonl' (from loom-jsonl) failed" in str(caught.value)
    assert "jsonl_driver" in str(caught.value)
    with pytest.raises(InvalidOptionError, match="jsonl_driver"):
        await open_storage("memory://", decorators=["metrics"], plugins=host)
    # A scheme of a distribution of ours that is not loaded here: both are said, the
    # install first (the failed plugin may serve something else).
    with pytest.raises(UnknownSchemeError) as ours:
        await open_storage("postgresql://localhost/x", plugins=host)
    said = str(ours.value)
    assert "install it" in said
    assert "jsonl_driver" in said
    assert said.index("install it") < said.index("jsonl_driver")


async def test_decorators_apply_innermost_first_with_their_options() -> None:
    log: list[str] = []
    host = PluginHost(entry_points=False)
    host.register(_decorator_plugin(Tagging("audit", log)), name="a", source="loom-a")
    host.register(_decorator_plugin(Tagging("crypto", log)), name="c", source="loom-c")
    async with open_storage(
        "memory://", decorators=["audit", ("crypto", {"tag": "k1"})], plugins=host
    ):
        pass
    assert log == ["audit:", "crypto:k1"]


class _Misbehaving:
    """A decorator whose decorate() breaks the contract in the way ``how`` says."""

    name = "misbehaving"

    def __init__(self, how: str) -> None:
        self.how = how
        self.given: list[Storage] = []

    def decorate(self, storage: Storage, options: Mapping[str, object]) -> object:
        self.given.append(storage)
        if self.how == "not-async":
            return storage
        return self._events_only(storage)

    async def _events_only(self, storage: Storage) -> object:
        return storage.events

    async def conformance_options(self, open_inner: InnerOpener) -> Mapping[str, object]:
        return {}


@pytest.mark.parametrize(
    ("how", "told"),
    [
        ("not-async", "returned a Storage, not an awaitable: define it with async def"),
        ("events-only", "returned a MemoryEventStore, not a loom_core.Storage"),
    ],
)
async def test_a_decorate_that_returns_no_storage_is_refused_naming_the_decorator(
    how: str, told: str
) -> None:
    decorator = _Misbehaving(how)
    host = PluginHost(entry_points=False)
    host.register(_decorator_plugin(decorator), name="m", source="loom-m")  # type: ignore[arg-type]
    with pytest.raises(PluginError, match=f"decorate\\(\\) of the decorator 'misbehaving' {told}"):
        await open_storage("memory://", decorators=["misbehaving"], plugins=host)
    [given] = decorator.given
    with pytest.raises(StoreClosedError):  # what it was given is closed, not leaked
        await given.events.head("e")


@pytest.mark.parametrize(
    ("factory", "told"),
    [
        (
            lambda url, options: Storage(
                MemoryEventStore(), MemoryTimerStore(), MemoryLeaseStore(), url=url
            ),
            "returned a Storage, not an awaitable",
        ),
        (
            lambda url, options: _tuple_of_stores(),
            "returned a tuple, not a loom_core.Storage",
        ),
    ],
)
async def test_a_backend_factory_that_returns_no_storage_is_refused_naming_its_scheme(
    factory: object, told: str
) -> None:
    @hookimpl
    def loom_register_backends(registry: BackendRegistry) -> None:
        registry.add_backend("odd", factory)  # type: ignore[arg-type]

    host = PluginHost(entry_points=False)
    host.register(
        types.SimpleNamespace(loom_register_backends=loom_register_backends), name="odd"
    )
    with pytest.raises(PluginError, match=f"the backend factory of odd:// {told}"):
        await open_storage("odd://", plugins=host)


async def _tuple_of_stores() -> object:
    return (MemoryEventStore(), MemoryTimerStore(), MemoryLeaseStore())


async def test_unknown_decorator_names_the_distribution_to_install() -> None:
    host = PluginHost(entry_points=False)
    with pytest.raises(InvalidOptionError, match=r"pip install \./plugins/loom_tenant"):
        await open_storage("memory://", decorators=["tenant"], plugins=host)
    with pytest.raises(InvalidOptionError, match="list of names"):
        await open_storage("memory://", decorators="tenant", plugins=host)
    with pytest.raises(InvalidOptionError, match="name or a"):
        await open_storage("memory://", decorators=[("tenant",)], plugins=host)  # type: ignore[list-item]


def test_the_host_names_the_loom_distribution_for_a_scheme_or_decorator() -> None:
    host = PluginHost(entry_points=False)
    assert host.backend_distribution("postgresql") == "loom-postgres"
    assert host.backend_distribution("sqlite") == "loom-sqlite"
    assert host.decorator_distribution("tenant") == "loom-tenant"
    assert host.backend_distribution("example") is None
    assert host.decorator_distribution("sqlite") is None


@pytest.fixture
def fake_distributions(tmp_path: Path) -> Iterator[Path]:
    """Installs two distributions with `loom` entry points: one good, one broken."""
    (tmp_path / "good_loom_plugin.py").write_text(
        "from loom_core.spi import hookimpl\n"
        "from loom_core.memory import open_memory\n"
        "@hookimpl\n"
        "def loom_register_backends(registry):\n"
        "    registry.add_backend('good', lambda url, opts: open_memory('memory://', opts))\n"
    )
    for dist, module in (("loom_good-1.0", "good_loom_plugin"), ("loom_broken-1.0", "no_such_mod")):
        info = tmp_path / f"{dist}.dist-info"
        info.mkdir()
        name = dist.split("-")[0].replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        plugin = name.split("-")[1]
        (info / "entry_points.txt").write_text(f"[loom]\n{plugin} = {module}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("good_loom_plugin", None)


async def test_entry_points_are_discovered_and_a_broken_one_is_reported(
    fake_distributions: Path,
) -> None:
    with pytest.warns(RuntimeWarning, match="'broken' \\(from loom-broken\\)"):
        host = PluginHost()
    async with open_storage("good://", plugins=host) as storage:
        await storage.events.append("e", [NewEvent("k")], expected_sequence=0)
    broken = [e for e in host.errors if isinstance(e, PluginLoadError) and e.plugin == "broken"]
    assert len(broken) == 1
    assert broken[0].distribution == "loom-broken"
    assert isinstance(broken[0].cause, ModuleNotFoundError)


async def test_the_first_open_discovers_the_plugins_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Discovery imports every installed plugin (a driver and its C extension): the
    first open_storage of a process does it in a thread, not on the event loop; later
    opens reuse the host."""
    from loom_core import plugins

    discovered_in: list[threading.Thread] = []
    make = plugins.PluginHost

    def recording() -> PluginHost:
        discovered_in.append(threading.current_thread())
        return make()

    monkeypatch.setattr(plugins, "_default", None)
    monkeypatch.setattr(plugins, "PluginHost", recording)
    for _ in range(2):
        async with open_storage("memory://") as storage:
            assert storage.url == "memory://"
    (thread,) = discovered_in
    assert thread is not threading.main_thread()


def test_a_plugin_that_asks_for_the_host_as_it_loads_does_not_hang_discovery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loom_core import plugins

    make = plugins.PluginHost
    asked: list[bool] = []

    def asking() -> PluginHost:
        if not asked:  # a plugin module calling default_plugins() at import
            asked.append(True)
            plugins.default_plugins()
        return make()

    monkeypatch.setattr(plugins, "_default", None)
    monkeypatch.setattr(plugins, "PluginHost", asking)
    found: list[PluginHost] = []
    discovery = threading.Thread(target=lambda: found.append(plugins.default_plugins()))
    discovery.daemon = True  # a deadlocked one must not keep the test run alive
    discovery.start()
    discovery.join(60)  # a guard against hanging the run, not a measure
    assert not discovery.is_alive(), "discovery deadlocked on its own lock"
    assert len(found) == 1


class _Forwarding:
    """A decorator that forwards everything to another, as a proxy does."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_decorator_that_forwards_its_members_is_registered() -> None:
    # Python 3.12 and 3.13 refused it ("is not a StorageDecorator"), 3.11 did not.
    registry = DecoratorRegistry()
    registry.add_decorator(_Forwarding(Tagging("tagging", [])))
    assert list(registry.decorators) == ["tagging"]


def test_something_that_is_not_a_decorator_is_refused_naming_what_it_lacks() -> None:
    with pytest.raises(InvalidOptionError, match="lacks conformance_options, decorate, name"):
        DecoratorRegistry().add_decorator(object())  # type: ignore[arg-type]
