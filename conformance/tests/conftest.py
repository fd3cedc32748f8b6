"""Registers the kit's two test decorators in-process, before collection, so
``decorator_params()`` finds them as it would find installed plugins."""

import kit_decorators

from loom_core.spi import default_plugins

pytest_plugins = ["pytester"]

default_plugins().register(kit_decorators, name="kit-test-decorators", source="kit tests")
