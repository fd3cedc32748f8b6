"""``python3 -m loom_bench``."""

from loom_bench.cli import main

raise SystemExit(main())
