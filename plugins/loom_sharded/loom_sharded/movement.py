"""Prints how many ids move when a shard is added: ``python -m loom_sharded.movement``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from loom_sharded.routing import measure_movement

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    count = int(args[0]) if args else 20_000
    ids = [f"execution-{i:06d}" for i in range(count)]
    print(f"{count} ids; adding one shard to N shards moves:")
    print("   N   moved   ideal 1/(N+1)   moved to an old shard")
    for shards in range(1, 9):
        m = measure_movement(shards, ids)
        print(f"{shards:4d}  {m.fraction:6.4f}   {m.ideal:6.4f}          {m.moved_elsewhere}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
