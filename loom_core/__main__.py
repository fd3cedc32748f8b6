import sys

from loom_core.cli import main

sys.exit(main())
