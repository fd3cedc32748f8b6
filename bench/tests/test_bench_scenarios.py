"""Each scenario writes exactly the events it names, through the SPI, on the memory store."""

from __future__ import annotations

import asyncio
import gc

import pytest
from loom_bench.backends import MemoryBackend
from loom_bench.drive import RunPlan, drive_concurrently, drive_sequentially
from loom_bench.loom_runs import NotOffered, measure_loom
from loom_bench.scenarios import (
    SCENARIOS,
    AcquireFence,
    Scenario,
    ScenarioError,
    expected_log,
    run_execution,
    run_setup,
    scenario,
)

from loom_core import open_storage
from loom_core.spi import PluginHost


@pytest.mark.parametrize("key", list(SCENARIOS))
async def test_one_execution_writes_exactly_the_expected_events(key: str) -> None:
    chosen = SCENARIOS[key]
    async with open_storage("memory://") as storage:
        await run_setup(storage.events, "e-1", chosen)
        await run_execution(storage.events, "e-1", chosen)
        events = await storage.events.read("e-1")
        assert [(e.kind, e.fence) for e in events] == list(expected_log(chosen))
        assert [e.sequence for e in events] == list(range(chosen.appends))
        assert await storage.events.list_executions() == ("e-1",)


def test_the_table_rows_are_the_originals_five_and_the_fenced_appends() -> None:
    assert {key: s.appends for key, s in SCENARIOS.items()} == {
        "short": 3,
        "short-fenced": 3,
        "short-fenced-appends": 3,
        "park-resume": 4,
        "park-resume-fence": 4,
        "park-resume-fence-if": 4,
    }
    assert SCENARIOS["park-resume-fence-if"].requires == {"acquire_fence_if"}
    assert SCENARIOS["short"].requires == frozenset()
    assert SCENARIOS["park-resume"].park_sequence == 1
    # The fenced appends hold the token their untimed setup took; nothing timed acquires.
    appends_only = SCENARIOS["short-fenced-appends"]
    assert appends_only.requires == {"acquire_fence"}
    assert appends_only.held_token == 1
    assert not any(isinstance(step, AcquireFence) for step in appends_only.steps)
    assert SCENARIOS["short-fenced"].held_token is None


async def test_a_setup_runs_before_the_clock_and_is_not_counted() -> None:
    ticks: list[int] = []
    plan = RunPlan(executions=5, concurrency=2, warmup=1, prefix="s")
    sample = await measure_loom(
        MemoryBackend(), (), SCENARIOS["short-fenced-appends"], plan, "s",
        lambda: ticks.append(1), PluginHost(entry_points=False),
    )
    assert sample.executions == 5
    assert len(ticks) == 5


def test_an_unknown_scenario_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="short-fenced"):
        scenario("long")


async def test_a_stale_conditional_acquire_is_an_error_not_a_counted_execution() -> None:
    chosen: Scenario = SCENARIOS["park-resume-fence-if"]
    async with open_storage("memory://") as storage:
        # A dead acquirer already moved the token: the park (token 0) is stale.
        await storage.events.acquire_fence("e-1")
        with pytest.raises(ScenarioError, match="stale"):
            await run_execution(storage.events, "e-1", chosen)
        kinds = [e.kind for e in await storage.events.read("e-1")]
        assert kinds == ["EXECUTION_STARTED", "EXECUTION_SUSPENDED"]


async def test_a_store_without_the_method_is_reported_not_offered() -> None:
    backend = MemoryBackend(options={"offer": ()})
    plan = RunPlan(executions=2, concurrency=1, warmup=0, prefix="t")
    with pytest.raises(NotOffered, match="acquire_fence_if"):
        await measure_loom(
            backend, (), SCENARIOS["park-resume-fence-if"], plan, "t", lambda: None,
            PluginHost(entry_points=False),
        )


async def test_a_loom_run_counts_every_execution_and_writes_each_once() -> None:
    ticks: list[int] = []
    plan = RunPlan(executions=7, concurrency=3, warmup=2, prefix="run")
    sample = await measure_loom(
        MemoryBackend(), (), SCENARIOS["short"], plan, "run", lambda: ticks.append(1),
        PluginHost(entry_points=False),
    )
    assert sample.executions == 7
    assert len(ticks) == 7  # the warm-up is not counted


async def test_drive_runs_every_index_once_with_at_most_concurrency_in_flight() -> None:
    seen: list[int] = []
    in_flight = 0
    most = 0

    async def execute(index: int) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)
        seen.append(index)
        in_flight -= 1

    sample = await drive_concurrently(20, 4, execute)
    assert sorted(seen) == list(range(20))
    assert most == 4
    assert sample.executions == 20


async def test_drive_raises_the_first_failure_itself_not_a_group() -> None:
    async def execute(index: int) -> None:
        if index == 3:
            raise ScenarioError("boom")
        await asyncio.sleep(0)

    with pytest.raises(ScenarioError, match="boom"):
        await drive_concurrently(10, 2, execute)


async def test_garbage_left_before_the_clock_is_collected_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []

    def collect() -> int:
        events.append("collect")
        return 0

    monkeypatch.setattr(gc, "collect", collect)

    async def execute(index: int) -> None:
        events.append(f"run {index}")

    await drive_concurrently(2, 1, execute)
    drive_sequentially(1, lambda index: events.append(f"alone {index}"))
    assert events == ["collect", "run 0", "run 1", "collect", "alone 0"]
