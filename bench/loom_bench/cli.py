"""The command: ``python3 -m bench`` (from the repository root), ``python3 -m loom_bench``
or ``loom-bench``.

::

    python3 -m bench --backends memory,sqlite,postgres --concurrency 64 \\
        --executions 3000 --runs 5 --stacks tenant,crypto,audit,sharded \\
        --json bench.json --markdown bench.md

``--compare BEFORE.json AFTER.json`` prints a row-by-row comparison of two reports instead
of running anything.

Prints the Markdown table on stdout (and writes it to ``--markdown``), writes the JSON to
``--json``, and draws one progress line on stderr while it runs. Exits 1 when a run
failed (a bug to look at), 2 on bad arguments; rows that are not installed, unavailable
or unsupported are reported in the table and do not change the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from loom_bench.backends import BACKEND_NAMES
from loom_bench.compare import CompareError, load_report, render_comparison
from loom_bench.report_json import render_json
from loom_bench.report_markdown import render_markdown
from loom_bench.runner import ALL_ROWS, BenchConfig, run_benchmark
from loom_bench.scenarios import SCENARIOS
from loom_bench.stacks import parse_stack
from loom_bench.workflows import WORKFLOW_CALLS

__all__ = ["build_parser", "config_from", "main", "redact"]


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _positive_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(item) for item in _list(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas: {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers of at least 1: {text!r}")
    return values


def _positive(text: str) -> int:
    return _positive_ints(text)[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench",
        description=(
            "Loom's throughput table (five kinds of execution, fenced and not) on the installed "
            "backends and decorator stacks, each row beside its raw-driver floor run in "
            "the same repetitions; workflows through loom-runtime, each beside the "
            "store making the same calls (and DBOS, where installed); and plain stream "
            "writes beside eventsourcing's recorders (where installed)."
        ),
    )
    parser.add_argument(
        "--backends", default="memory,sqlite,postgres",
        help="comma-separated: memory, sqlite, postgres (default: all three)",
    )
    parser.add_argument(
        "--postgres-url",
        help="PostgreSQL server to use; without it a throwaway server is started through "
        "the conformance kit's harness (loom_conformance.postgres)",
    )
    parser.add_argument(
        "--concurrency", type=_positive_ints, default=(64,),
        help="concurrent executions, or several separated by commas (default 64)",
    )
    parser.add_argument(
        "--executions", type=_positive, default=3000,
        help="timed executions per run (default 3000)",
    )
    parser.add_argument(
        "--runs", type=_positive, default=5, help="repetitions; figures are medians (default 5)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None,
        help="untimed executions before each run (default: a tenth of --executions)",
    )
    parser.add_argument(
        "--scenarios", default="all",
        help=f"comma-separated rows, or 'all': {', '.join(ALL_ROWS)}",
    )
    parser.add_argument(
        "--stacks", default="",
        help="decorator-overhead rows, comma-separated; each a decorator name or several "
        "joined by '+' (innermost first), e.g. tenant,crypto,audit,sharded,crypto+audit",
    )
    parser.add_argument(
        "--stack-scenario", default="short", choices=list(SCENARIOS),
        help="the execution the stack rows run (default short)",
    )
    parser.add_argument(
        "--sqlite-synchronous", default="NORMAL", choices=["NORMAL", "FULL"],
        help="PRAGMA synchronous for our SQLite store and its raw floor (default NORMAL)",
    )
    parser.add_argument(
        "--workflow-call", default="start", choices=list(WORKFLOW_CALLS),
        help="how the workflow rows run each workflow: app.start then handle.result() "
        "(default), or app.execute, which drives the body in the calling task",
    )
    parser.add_argument("--pgbench", help="pgbench executable (default: found on PATH)")
    parser.add_argument("--no-raw", action="store_true", help="skip the raw floors")
    parser.add_argument("--no-pgbench", action="store_true", help="skip pgbench")
    parser.add_argument(
        "--no-dbos", action="store_true", help="skip DBOS beside the one-step workflow"
    )
    parser.add_argument(
        "--no-eventsourcing", action="store_true",
        help="skip eventsourcing's recorders beside the stream rows",
    )
    parser.add_argument("--json", type=Path, help="write the JSON report here")
    parser.add_argument("--markdown", type=Path, help="also write the Markdown table here")
    parser.add_argument(
        "--workdir", type=Path, help="where SQLite files go (default: a temporary directory)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress line")
    parser.add_argument(
        "--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
        help="compare two --json reports row by row instead of running",
    )
    return parser


def config_from(args: argparse.Namespace) -> BenchConfig:
    """A BenchConfig from parsed arguments; ValueError says what is wrong."""
    backends = tuple(_list(args.backends))
    unknown = [name for name in backends if name not in BACKEND_NAMES]
    if not backends or unknown:
        raise ValueError(f"--backends takes {', '.join(BACKEND_NAMES)}; got {args.backends!r}")
    scenarios = ALL_ROWS if args.scenarios == "all" else tuple(_list(args.scenarios))
    stacks = tuple(parse_stack(item) for item in _list(args.stacks))
    warmup = args.warmup if args.warmup is not None else args.executions // 10
    return BenchConfig(
        backends=backends,
        concurrency=tuple(args.concurrency),
        executions=args.executions,
        runs=args.runs,
        warmup=warmup,
        scenarios=scenarios,
        stacks=stacks,
        stack_scenario=args.stack_scenario,
        sqlite_synchronous=args.sqlite_synchronous,
        workflow_call=args.workflow_call,
        postgres_url=args.postgres_url,
        pgbench=args.pgbench,
        raw=not args.no_raw,
        ceiling=not args.no_pgbench,
        peer=not args.no_dbos,
        eventsourcing=not args.no_eventsourcing,
        workdir=args.workdir,
    )


def redact(url: str) -> str:
    """``url`` with its password replaced, for the report."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _command(argv: Sequence[str]) -> str:
    shown = [redact(arg) if "://" in arg else arg for arg in argv]
    return shlex.join(["python3", "-m", "bench", *shown])


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.compare:
        try:
            before, after = (load_report(path) for path in args.compare)
        except CompareError as exc:
            parser.error(str(exc))
        sys.stdout.write(render_comparison(before, after))
        return 0
    try:
        config = config_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    result = asyncio.run(
        run_benchmark(config, show_progress=not args.no_progress, command=_command(arguments))
    )
    markdown = render_markdown(result)
    sys.stdout.write(markdown)
    if args.markdown:
        args.markdown.write_text(markdown)
    if args.json:
        args.json.write_text(render_json(result))
    return 1 if any(row.status == "failed" for row in result.rows) else 0
