"""The thread-pool driver a synchronous peer is run with."""

from __future__ import annotations

import threading

import pytest
from loom_bench.drive import drive_threads
from loom_bench.scenarios import ScenarioError


def test_threads_run_every_index_once_with_concurrency_in_flight() -> None:
    seen: list[int] = []
    lock = threading.Lock()
    # The first four executions can only pass this together: four threads are in flight
    # at once, forced rather than timed.
    together = threading.Barrier(4, timeout=30)
    ticks: list[int] = []

    def execute(index: int) -> None:
        if index < 4:
            together.wait()
        with lock:
            seen.append(index)

    sample = drive_threads(20, 4, execute, lambda: ticks.append(1))
    assert sorted(seen) == list(range(20))
    assert sample.executions == 20
    assert len(ticks) == 20


def test_threads_never_exceed_the_concurrency() -> None:
    lock = threading.Lock()
    in_flight = 0
    most = 0
    names: set[str] = set()

    def execute(index: int) -> None:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
            names.add(threading.current_thread().name)
        with lock:
            in_flight -= 1

    drive_threads(50, 3, execute)
    assert most <= 3
    assert len(names) <= 3
    assert threading.current_thread().name not in names


def test_threads_raise_the_first_failure_itself_and_stop_taking_work() -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def execute(index: int) -> None:
        with lock:
            ran.append(index)
        if index == 0:
            raise ScenarioError("boom")

    with pytest.raises(ScenarioError, match="boom"):
        drive_threads(1000, 1, execute)
    assert ran == [0]
