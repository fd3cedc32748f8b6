"""The JSON report: every sample, the summaries, the targets, the machine and parameters.

Meant for comparing commits: each row keeps its per-repetition samples (None where a
repetition did not measure), so a later tool can re-pair or re-summarise them. The layout
is versioned by ``schema``; a change that renames or removes a field bumps it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Final

from loom_bench.results import BenchResult, RowResult, SideResult
from loom_bench.statistics import Sample, Spread
from loom_bench.targets import evaluate

__all__ = ["SCHEMA", "render_json", "to_json_data"]

SCHEMA: Final = "loom-bench/1"


def _spread(spread: Spread | None) -> dict[str, object] | None:
    return None if spread is None else dataclasses.asdict(spread)


def _sample(sample: Sample | None) -> dict[str, float | int] | None:
    if sample is None:
        return None
    return {**dataclasses.asdict(sample), "per_second": sample.per_second}


def _side(side: SideResult | None) -> dict[str, object] | None:
    if side is None:
        return None
    return {
        "label": side.label,
        "error": side.error,
        "note": side.note,
        "per_second": _spread(side.throughput),
        "p50_ms": _spread(side.p50_ms),
        "samples": [_sample(s) for s in side.samples],
    }


def _row(row: RowResult) -> dict[str, object]:
    spec = row.spec
    data: dict[str, object] = {
        "key": spec.key,
        "kind": spec.kind,
        "backend": spec.backend,
        "scenario": spec.scenario,
        "title": spec.title,
        "stack": list(spec.stack),
        "concurrency": spec.concurrency,
        "status": row.status,
        "note": row.note,
        "ours": _side(row.ours),
    }
    if spec.kind == "workflow":
        # ours is the runtime; its floor is the store making the same calls; its peer DBOS.
        data.update({
            "store": _side(row.raw),
            "peer": _side(row.ceiling),
            "ours_over_store": _spread(row.vs_raw),
            "ours_over_peer": _spread(row.vs_ceiling),
        })
        return data
    if spec.kind == "stream":
        # ours is the store; beside it eventsourcing's aggregate and application recorders.
        data.update({
            "eventsourcing_aggregate": _side(row.raw),
            "eventsourcing_application": _side(row.ceiling),
            "ours_over_eventsourcing_aggregate": _spread(row.vs_raw),
            "ours_over_eventsourcing_application": _spread(row.vs_ceiling),
        })
        return data
    data.update({
        "raw": _side(row.raw),
        "pgbench": _side(row.ceiling),
        "ours_over_raw": _spread(row.vs_raw),
        "ours_over_pgbench": _spread(row.vs_ceiling),
        "ours_over_undecorated": _spread(row.vs_bare),
    })
    return data


def to_json_data(result: BenchResult) -> dict[str, object]:
    """The report as plain JSON-ready data."""
    return {
        "schema": SCHEMA,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "parameters": dataclasses.asdict(result.parameters),
        "machine": dict(result.machine),
        "settings": {name: dict(values) for name, values in result.settings.items()},
        "rows": [_row(row) for row in result.rows],
        "targets": [
            {
                "name": check.name,
                "backend": check.backend,
                "concurrency": check.concurrency,
                "description": check.description,
                "kind": check.kind,
                "comparison": check.comparison,
                "threshold": check.threshold,
                "measured": _spread(check.measured),
                "met": check.met,
                "verdict": check.verdict,
                "note": check.note,
            }
            for check in evaluate(result)
        ],
    }


def render_json(result: BenchResult) -> str:
    return json.dumps(to_json_data(result), indent=2, sort_keys=False) + "\n"
