"""The one fixture a store author overrides: how the kit opens a fresh store."""

import pytest
from loom_conformance import StorageFactory

from loom_core import Storage, open_storage


@pytest.fixture
def loom_storage_factory() -> StorageFactory:
    async def open_fresh() -> Storage:
        # Through the installed entry point, exactly as a user would open it.
        return await open_storage("example://")

    return open_fresh
