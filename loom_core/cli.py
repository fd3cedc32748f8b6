"""The ``loom`` command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from loom_core.demo import run_demo
from loom_core.errors import LoomError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m loom_core", description="Loom durable-execution kernel"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="park and resume an execution under a fence")
    demo.add_argument("--url", default="memory://", help="storage URL (default memory://)")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            asyncio.run(run_demo(args.url))
    except LoomError as exc:
        print(f"loom: {exc}", file=sys.stderr)
        return 1
    return 0
