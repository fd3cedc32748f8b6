"""``python -m loom_runtime``: the ``loom`` command (see :mod:`loom_runtime.cli`)."""

from loom_runtime.cli import main

main()
