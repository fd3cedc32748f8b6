"""Loom's benchmark harness: the throughput of five kinds of execution on any installed
backend and decorator stack, every row beside the raw-driver floor measured in the same run;
and of workflows through loom-runtime, each beside the store making the same calls (and
DBOS's equivalent, where it is installed).

Run it with ``python3 -m bench`` from the repository root (see ``docs/benchmarks.md``), or
from code::

    result = await run_benchmark(BenchConfig(backends=("memory", "sqlite"), runs=3))
    print(render_markdown(result))
"""

from loom_bench.report_json import render_json, to_json_data
from loom_bench.report_markdown import render_markdown
from loom_bench.results import BenchResult, Parameters, RowResult, RowSpec, SideResult
from loom_bench.runner import BenchConfig, run_benchmark
from loom_bench.scenarios import SCENARIOS, Scenario, run_execution
from loom_bench.statistics import Sample, Spread
from loom_bench.targets import TargetCheck, evaluate
from loom_bench.workflows import WORKFLOWS, WorkflowScenario

__all__ = [
    "SCENARIOS",
    "WORKFLOWS",
    "BenchConfig",
    "BenchResult",
    "Parameters",
    "RowResult",
    "RowSpec",
    "Sample",
    "Scenario",
    "SideResult",
    "Spread",
    "TargetCheck",
    "WorkflowScenario",
    "evaluate",
    "render_json",
    "render_markdown",
    "run_benchmark",
    "run_execution",
    "to_json_data",
]
