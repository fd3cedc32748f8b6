"""``python -m loom_conformance.explorer [--url URL] [--steps N] [--isolation …]``."""

import sys

from loom_conformance.explorer import main

sys.exit(main())
