"""``python3 -m bench`` from the repository root: the benchmark harness in ``bench/``.

Works whether or not ``loom-bench`` is installed: the harness's own folder is put on the
path first, so the checkout's code is what runs.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loom_bench.cli import main

raise SystemExit(main())
