"""Compare two JSON reports (two commits, or before and after a change), row by row.

Absolute executions/s from two runs are only comparable on the same machine in the same
minute; ours-over-floor ratios are comparable across runs, because each was paired with a
floor run next to it. So the comparison prints both, and the change of the ratio is the
one to read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loom_bench.report_json import SCHEMA

__all__ = ["CompareError", "load_report", "render_comparison"]

_DASH = "\u2014"


class CompareError(ValueError):
    """A file is not a loom-bench JSON report of a schema this version reads."""


def load_report(path: Path) -> dict[str, Any]:
    """Read a ``--json`` report; refuses another file or another schema version."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CompareError(f"{path}: not a readable JSON report ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise CompareError(f"{path}: schema {found!r}, expected {SCHEMA!r}")
    return data


def _median(row: Mapping[str, Any] | None, *path: str) -> float | None:
    value: Any = row
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    if isinstance(value, Mapping):
        median = value.get("median")
        return float(median) if isinstance(median, int | float) else None
    return None


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None or before == 0:
        return _DASH
    return f"{after / before - 1:+.1%}"


def _rate(value: float | None) -> str:
    return _DASH if value is None else f"{value:,.0f}".replace(",", " ")


def _ratio(value: float | None) -> str:
    return _DASH if value is None else f"{value:.2f}\u00d7"


def render_comparison(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """A Markdown table: each row's executions/s and ours-over-floor ratio, before and
    after, and their changes (rows present in only one report are listed too)."""
    old = {row["key"]: row for row in before.get("rows", [])}
    new = {row["key"]: row for row in after.get("rows", [])}
    keys = list(old) + [key for key in new if key not in old]
    commit_before = str(before.get("machine", {}).get("commit") or "?")[:12]
    commit_after = str(after.get("machine", {}).get("commit") or "?")[:12]
    lines = [
        f"## {commit_before} \u2192 {commit_after}",
        "",
        "| row | executions/s before | after | change | ours/floor before | after | change |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        a, b = old.get(key), new.get(key)
        rate_a, rate_b = _median(a, "ours", "per_second"), _median(b, "ours", "per_second")
        floor = next(
            (
                key
                for key in (
                    "ours_over_raw", "ours_over_store", "ours_over_eventsourcing_aggregate"
                )
                if _median(a, key) is not None or _median(b, key) is not None
            ),
            "ours_over_undecorated",
        )
        ratio_a, ratio_b = _median(a, floor), _median(b, floor)
        lines.append(
            f"| {key} | {_rate(rate_a)} | {_rate(rate_b)} | {_change(rate_a, rate_b)} | "
            f"{_ratio(ratio_a)} | {_ratio(ratio_b)} | {_change(ratio_a, ratio_b)} |"
        )
    lines += [
        "",
        "The floor is the raw driver of the same run (for a workflow row, the store making the "
        "same calls; for a stream row, eventsourcing's aggregate recorder; for a decorator "
        "row without one, the undecorated row). Read the change "
        "of the ratio: it is paired, the rates are not.",
    ]
    return "\n".join(lines) + "\n"
