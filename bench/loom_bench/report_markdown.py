"""The Markdown report: one table per backend (and one of its workflow rows, and one of
its stream rows beside eventsourcing), the decorator stacks, the targets.

Throughput is "median (min-max)" executions per second; p50 is the median over runs of
each run's median latency; ratios are paired per repetition and printed as
"medianx (min-max)" (with a multiplication sign and an en dash in the output).
"""

from __future__ import annotations

from collections.abc import Sequence

from loom_bench.results import BenchResult, RowResult, SideResult
from loom_bench.statistics import Spread
from loom_bench.targets import TargetCheck, Verdict, evaluate

__all__ = ["format_overhead", "format_rate", "format_ratio", "render_markdown"]

_DASH = "\u2014"  # em dash: nothing measured
_TO = "\u2013"  # en dash between min and max
_TIMES = "\u00d7"


def _number(value: float) -> str:
    return f"{value:,.0f}".replace(",", " ")


def format_rate(spread: Spread | None) -> str:
    """``"5 292 (5 038-5 379)"``; a single run prints its value alone."""
    if spread is None:
        return _DASH
    if spread.count == 1:
        return _number(spread.median)
    return (
        f"{_number(spread.median)} ({_number(spread.minimum)}{_TO}{_number(spread.maximum)})"
    )


def format_ratio(spread: Spread | None) -> str:
    """``"0.72x (0.68-0.75)"``."""
    if spread is None:
        return _DASH
    if spread.count == 1:
        return f"{spread.median:.2f}{_TIMES}"
    return f"{spread.median:.2f}{_TIMES} ({spread.minimum:.2f}{_TO}{spread.maximum:.2f})"


def format_overhead(spread: Spread | None) -> str:
    """``"+8.1% (+5.0% - +12.3%)"``: extra time per execution."""
    if spread is None:
        return _DASH
    if spread.count == 1:
        return f"{spread.median:+.1%}"
    return f"{spread.median:+.1%} ({spread.minimum:+.1%} {_TO} {spread.maximum:+.1%})"


def _ms(spread: Spread | None) -> str:
    return _DASH if spread is None else f"{spread.median:.1f}"


def _cells(side: SideResult | None) -> list[str]:
    if side is None:
        return [_DASH, _DASH]
    if side.throughput is None and side.note:
        return [f"*{side.note}*", _DASH]
    if side.throughput is None and side.error:
        return [f"failed: {side.error}", _DASH]
    return [format_rate(side.throughput), _ms(side.p50_ms)]


def _status_cell(row: RowResult) -> str:
    return f"*{row.status}*" + (f": {row.note}" if row.note else "")


def _table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in lines]
    return out


def _label(row: RowResult, many_concurrencies: bool) -> str:
    return f"{row.spec.label} (C={row.spec.concurrency})" if many_concurrencies else row.spec.label


def _backend_section(
    backend: str, rows: Sequence[RowResult], result: BenchResult, many: bool
) -> list[str]:
    raw_label = next((r.raw.label for r in rows if r.raw is not None), None)
    ceiling_label = next((r.ceiling.label for r in rows if r.ceiling is not None), None)
    header = ["execution", "Loom executions/s", "p50 ms"]
    if raw_label:
        header += [f"{raw_label} executions/s", f"{raw_label} p50 ms", f"Loom / {raw_label}"]
    if ceiling_label:
        header += [
            f"{ceiling_label} executions/s", f"{ceiling_label} p50 ms",
            f"Loom / {ceiling_label}",
        ]
    lines = []
    first = rows[0]
    if first.status != "ok" and all(
        (r.status, r.note) == (first.status, first.note) for r in rows
    ):
        # The whole backend is missing: say it once.
        return [f"### {backend}", "", _status_cell(first), ""]
    for row in rows:
        if row.status != "ok":
            lines.append(
                [_label(row, many), _status_cell(row)] + [_DASH] * (len(header) - 2)
            )
            continue
        line = [_label(row, many), *_cells(row.ours)]
        if raw_label:
            line += [*_cells(row.raw), format_ratio(row.vs_raw)]
        if ceiling_label:
            line += [*_cells(row.ceiling), format_ratio(row.vs_ceiling)]
        lines.append(line)
    out = [f"### {backend}", "", *_table(header, lines), ""]
    notes = _backend_notes(backend, rows, result, raw_label)
    if notes:
        out += [notes, ""]
    return out


def _backend_notes(
    backend: str, rows: Sequence[RowResult], result: BenchResult, raw_label: str | None
) -> str:
    settings = result.settings.get(backend, {})
    if backend == "memory":
        return (
            "memory has no raw floor: there is no bare driver to compare an in-process "
            "store with."
        )
    if backend == "sqlite" and settings:
        return (
            f"SQLite {settings.get('sqlite_version')}, WAL, synchronous "
            f"{settings.get('synchronous')}, a fresh file per run for each side. The raw "
            "floor is one `sqlite3` loop (one writer, one transaction per append), so its "
            "p50 is one execution alone, not one among the concurrent ones."
        )
    if backend == "postgres" and settings:
        keys = ("postgres_server_version", "postgres_fsync", "postgres_synchronous_commit",
                "postgres_shared_buffers", "postgres_max_connections")
        described = ", ".join(
            f"{key.removeprefix('postgres_')} {settings[key]}" for key in keys if key in settings
        )
        return (
            f"PostgreSQL ({result.parameters.postgres}): {described}. The raw floor is "
            "bare psycopg, one connection per concurrent execution, one transaction per "
            "append; pgbench runs the same statements as one script per execution "
            "(prepared, clients = concurrency)."
        )
    return ""


def _workflow_section(
    backend: str, rows: Sequence[RowResult], result: BenchResult, many: bool
) -> list[str]:
    peer = next((r.ceiling.label for r in rows if r.ceiling is not None), None)
    header = [
        "workflow", "runtime workflows/s", "p50 ms", "store, same calls: workflows/s",
        "store p50 ms", "runtime / store",
    ]
    if peer:
        header += [f"{peer} workflows/s", f"{peer} p50 ms", f"runtime / {peer}"]
    first = rows[0]
    title = f"### {backend}: workflows"
    if first.status != "ok" and all(
        (r.status, r.note) == (first.status, first.note) for r in rows
    ):
        return [title, "", _status_cell(first), ""]
    lines = []
    for row in rows:
        if row.status != "ok":
            lines.append([_label(row, many), _status_cell(row)] + [_DASH] * (len(header) - 2))
            continue
        line = [_label(row, many), *_cells(row.ours), *_cells(row.raw), format_ratio(row.vs_raw)]
        if peer:
            line += [*_cells(row.ceiling), format_ratio(row.vs_ceiling)]
        lines.append(line)
    call = (
        "`app.execute`, the body in the calling task"
        if result.parameters.workflow_call == "execute"
        else "`app.start`, then `handle.result()`"
    )
    note = (
        f"Each workflow runs through `loom_runtime.Loom` over a fresh storage ({call}); "
        "the store column is its twin on a fresh storage of the same "
        "backend, run back to back with it in every repetition: the same store calls, call "
        "for call, with the same payloads and fences, and nothing else. The timer service is "
        "off on both sides (a zero-length sleep is answered by the run's own resume)."
    )
    if peer:
        note += (
            f" {peer}: DBOS's equivalent one-step workflow (`DBOS.start_workflow_async`, then "
            "`get_result()`), its system database a database of its own on the same server."
        )
    return [title, "", *_table(header, lines), "", note, ""]


def _stream_section(
    backend: str, rows: Sequence[RowResult], result: BenchResult, many: bool
) -> list[str]:
    aggregate = next((r.raw.label for r in rows if r.raw is not None), None)
    application = next((r.ceiling.label for r in rows if r.ceiling is not None), None)
    peers = [label for label in (aggregate, application) if label is not None]
    header = ["write", "Loom writes/s", "p50 ms"]
    for peer in peers:
        header += [f"{peer} writes/s", f"{peer} p50 ms", f"Loom / {peer}"]
    title = f"### {backend}: streams beside eventsourcing"
    first = rows[0]
    if first.status != "ok" and all(
        (r.status, r.note) == (first.status, first.note) for r in rows
    ):
        return [title, "", _status_cell(first), ""]
    lines = []
    for row in rows:
        if row.status != "ok":
            lines.append([_label(row, many), _status_cell(row)] + [_DASH] * (len(header) - 2))
            continue
        line = [_label(row, many), *_cells(row.ours)]
        if aggregate:
            line += [*_cells(row.raw), format_ratio(row.vs_raw)]
        if application:
            line += [*_cells(row.ceiling), format_ratio(row.vs_ceiling)]
        lines.append(line)
    return [title, "", *_table(header, lines), "", _stream_note(backend, result, peers), ""]


def _stream_note(backend: str, result: BenchResult, peers: Sequence[str]) -> str:
    note = (
        "Each write is one append through `open_storage` and the SPI (a new stream: three "
        "events at `expected_sequence=0`; an append: one event at 3, to a stream of three "
        "written before the clock), by asyncio tasks."
    )
    if not peers:
        return note
    note += (
        " Beside it, in the same repetitions, eventsourcing's recorders make the same "
        "writes (`insert_events` of stored events with the same kinds and JSON payloads, "
        "versions 1-3, or 4), driven by a pool of as many threads as the concurrency: the "
        "aggregate recorder inserts the events; the application recorder also numbers them "
        "for its notification log."
    )
    settings = result.settings.get(backend, {})
    if backend == "sqlite":
        ours = (
            f"Loom: journal_mode {settings.get('loom_journal_mode', '?')} (read back from its "
            f"file), synchronous {settings.get('synchronous', '?')} (set on every connection "
            "it opens)"
        )
        theirs = (
            f"eventsourcing: journal_mode {settings.get('eventsourcing_journal_mode', '?')}, "
            f"synchronous {settings.get('eventsourcing_synchronous', '?')} (read back through "
            "a connection of its pool)"
        )
        return f"{note} Durability: {ours}; {theirs}. A fresh file per run for each side."
    if backend == "postgres":
        ours = (
            f"Loom's database: fsync {settings.get('postgres_fsync', '?')}, "
            f"synchronous_commit {settings.get('postgres_synchronous_commit', '?')}"
        )
        theirs = (
            f"eventsourcing's (read back through a connection of its pool): fsync "
            f"{settings.get('eventsourcing_fsync', '?')}, synchronous_commit "
            f"{settings.get('eventsourcing_synchronous_commit', '?')}"
        )
        return (
            f"{note} Durability on the one server: {ours}; {theirs}. eventsourcing writes "
            "into a database of its own on it."
        )
    return note


def _stacks_section(rows: Sequence[RowResult], many: bool) -> list[str]:
    header = ["backend", "stack", "Loom executions/s", "p50 ms", "vs undecorated", "Loom / raw"]
    lines = []
    for row in rows:
        stack = _label(row, many)
        if row.status != "ok":
            lines.append([row.spec.backend, stack, _status_cell(row), _DASH, _DASH, _DASH])
            continue
        lines.append(
            [row.spec.backend, stack, *_cells(row.ours), format_ratio(row.vs_bare),
             format_ratio(row.vs_raw)]
        )
    title = rows[0].spec.title if rows else ""
    return [
        f"### Decorator stacks (execution: {title})",
        "",
        *_table(header, lines),
        "",
        "\"vs undecorated\" is the stack over the same backend's undecorated row, paired "
        "per repetition. `sharded` runs over two databases of the backend (two files, two "
        "PostgreSQL databases); the other decorators use the options their plugin gives "
        "the conformance kit.",
        "",
    ]


_VERDICTS: dict[Verdict, str] = {
    "met": "yes",
    "not met": "**no**",
    "undecided": "undecided (runs too noisy or too few)",
    "not measured": _DASH,
    "reference": "(reference)",
}


def _bound(kind: str, value: float) -> str:
    return f"{value:.2f}{_TIMES}" if kind == "ratio" else f"{value:+.1%}"


def _targets_section(checks: Sequence[TargetCheck]) -> list[str]:
    header = ["name", "backend", "C", "target", "measured", "interval of the median", "met"]
    lines = []
    for check in checks:
        formatter = format_ratio if check.kind == "ratio" else format_overhead
        if check.threshold is None:
            target = check.description
        else:
            target = f"{check.description} {check.comparison} {_bound(check.kind, check.threshold)}"
        measured = formatter(check.measured) if check.measured else f"not measured: {check.note}"
        interval = check.measured.interval if check.measured is not None else None
        shown = _DASH
        if interval is not None:
            shown = (
                f"{_bound(check.kind, interval.low)} {_TO} {_bound(check.kind, interval.high)} "
                f"({interval.confidence:.0%})"
            )
        lines.append([check.name, check.backend, str(check.concurrency), target, measured,
                      shown, _VERDICTS[check.verdict]])
    return [
        "### Targets",
        "",
        *_table(header, lines),
        "",
        "A target is met when the whole confidence interval of its median meets it, and "
        "not met when none of it does; otherwise it is undecided, and more `--runs` "
        "narrow the interval. The interval comes from order statistics alone, so it "
        "assumes nothing about how runs are distributed; with five runs it is the whole "
        "range.",
        "",
    ]


def _libraries(distributions: object) -> str:
    """The installed distributions the figures depend on, one line."""
    if not isinstance(distributions, dict) or not distributions:
        return ""
    listed = ", ".join(f"{name} {version}" for name, version in distributions.items())
    return f"Installed: {listed}."


def render_markdown(result: BenchResult) -> str:
    """The whole report as Markdown (headings from level 2 down)."""
    p = result.parameters
    m = result.machine
    many = len(p.concurrency) > 1
    commit = str(m.get("commit") or "unknown")[:12]
    dirty = " (uncommitted changes)" if m.get("dirty") else ""
    load = f"{m.get('load_average_before')} → {m.get('load_average_after')}"
    concurrency = ", ".join(str(c) for c in p.concurrency)
    out = [
        f"## Loom throughput, {result.started_at} (commit {commit}{dirty})",
        "",
        f"`{p.command}`" if p.command else "",
        "",
        f"Machine: {m.get('cpu_model')}, {m.get('nproc')} CPUs, {m.get('python')}, "
        f"{m.get('platform')}; load average (1/5/15 min) {load}.",
        "",
        _libraries(m.get("distributions")),
        "",
        (
            f"Each figure: median of {p.runs} runs (min{_TO}max) of "
            if p.runs > 1
            else "Each figure: one run of "
        )
        + f"{_number(p.executions)} "
        f"executions at {concurrency} concurrent, after {p.warmup} untimed warm-up "
        "executions. Ratios are taken per repetition between runs made back to back, then "
        "summarised the same way. The machine is shared and noisy: the ratios are the "
        "figures that count.",
        "",
    ]
    bare = [r for r in result.rows if not r.spec.stack and r.spec.kind == "store"]
    workflows = [r for r in result.rows if r.spec.kind == "workflow"]
    streams = [r for r in result.rows if r.spec.kind == "stream"]
    stacked = [r for r in result.rows if r.spec.stack]
    for backend in p.backends:
        rows = [r for r in bare if r.spec.backend == backend]
        if rows:
            out += _backend_section(backend, rows, result, many)
        flows = [r for r in workflows if r.spec.backend == backend]
        if flows:
            out += _workflow_section(backend, flows, result, many)
        writes = [r for r in streams if r.spec.backend == backend]
        if writes:
            out += _stream_section(backend, writes, result, many)
    if stacked:
        out += _stacks_section(stacked, many)
    checks = evaluate(result)
    if checks:
        out += _targets_section(checks)
    return "\n".join(out).rstrip() + "\n"
