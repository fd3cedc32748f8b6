"""The plugin as a user meets it: discovered through its entry point."""

import pytest
from loom_example_store import DictEventStore

from loom_core import InvalidOptionError, InvalidURLError, open_storage
from loom_core.spi import PluginHost


def test_the_entry_point_registers_the_example_scheme() -> None:
    host = PluginHost()
    assert "example" in host.backends.factories
    assert host.backends.source_of("example") == "loom-example-store"
    assert not host.errors


async def test_open_storage_opens_a_dict_store_offering_two_methods() -> None:
    async with open_storage("example://") as storage:
        assert isinstance(storage.events, DictEventStore)
        assert storage.events.capabilities == {"acquire_fence", "acquire_fence_if"}


async def test_bad_urls_and_options_are_refused() -> None:
    with pytest.raises(InvalidURLError):
        await open_storage("example://somewhere/else")
    with pytest.raises(InvalidOptionError):
        await open_storage("example://", options={"size": 3})
