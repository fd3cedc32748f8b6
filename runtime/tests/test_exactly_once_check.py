"""The kill tests' check (``loom_runtime.demo.violations``) catches each way a trial can
break exactly-once, and passes a trial that kept it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from loom_runtime.demo import Trace, Trial, Worker, violations

from loom_core import Event, EventKind, JsonValue

KILLED, RESTARTED = 100, 200


def event(kind: str, payload: JsonValue = None, fence: int = 0) -> Event:
    return Event("t", 0, kind, payload, {"fence": fence}, datetime(2030, 1, 1, tzinfo=UTC))


def step(name: str, pid: int, count: int, fence: int) -> Event:
    result: JsonValue = {"step": name, "pid": pid, "count": count}
    payload: JsonValue = {"position": [0], "call": "step", "name": name, "result": result}
    return event(EventKind.STEP_COMPLETED, payload, fence)


def numbered(events: list[Event]) -> tuple[Event, ...]:
    return tuple(dataclasses.replace(e, sequence=n) for n, e in enumerate(events))


RESULT: JsonValue = [
    {"step": "step-1", "pid": KILLED, "count": 1},
    {"step": "step-2", "pid": RESTARTED, "count": 2},
    {"step": "step-3", "pid": RESTARTED, "count": 1},
]

# The first worker recorded step-1, died in step-2 after its effect; the second served
# step-1 from the log, ran step-2 again and step-3.
KEPT = Trial(
    execution_id="t",
    steps=3,
    workers=(
        Worker(0, KILLED, "started", killed=True),
        Worker(1, RESTARTED, "recovering", killed=False, result=RESULT),
    ),
    log=numbered(
        [
            event(EventKind.EXECUTION_STARTED, {}),
            step("step-1", KILLED, 1, 0),
            event(EventKind.EXECUTION_RECOVERED, {"node": "w1", "fence": 1}, 1),
            step("step-2", RESTARTED, 2, 1),
            step("step-3", RESTARTED, 1, 1),
            event(EventKind.EXECUTION_COMPLETED, {"result": RESULT}, 1),
        ]
    ),
    traces=(
        Trace("step-1", KILLED, "start"),
        Trace("step-2", KILLED, "start"),
        Trace("step-1", RESTARTED, "replayed"),
        Trace("step-2", RESTARTED, "start"),
        Trace("step-3", RESTARTED, "start"),
    ),
    counters={"step-1": 1, "step-2": 2, "step-3": 1},
    ran_for=0.0,
)


def test_a_trial_that_kept_exactly_once_has_no_violation() -> None:
    assert violations(KEPT) == []


def with_log(change: Callable[[list[Event]], list[Event]], renumber: bool = True) -> Trial:
    log = change(list(KEPT.log))
    return dataclasses.replace(KEPT, log=numbered(log) if renumber else tuple(log))


BROKEN: dict[str, tuple[Trial, str]] = {
    "a gap": (
        with_log(lambda log: log[:2] + log[3:], renumber=False),
        "sequences are [0, 1, 3, 4, 5], not 0..4 without gap or duplicate",
    ),
    "a duplicate sequence": (
        with_log(
            lambda log: [*log[:3], dataclasses.replace(log[3], sequence=2), *log[4:]],
            renumber=False,
        ),
        "sequences are [0, 1, 2, 2, 4, 5]",
    ),
    "two completions": (
        with_log(lambda log: [*log, log[-1]]),
        "2 EXECUTION_COMPLETED events, not exactly one",
    ),
    "no completion": (with_log(lambda log: log[:-1]), "0 EXECUTION_COMPLETED events"),
    "a fenced-out writer's append": (
        with_log(lambda log: [*log[:4], step("step-3", RESTARTED, 1, 0), log[5]]),
        "event 4 was written under token 0 after token 1: a fenced-out writer appended",
    ),
    "a step recorded twice": (
        with_log(lambda log: [*log[:2], step("step-1", KILLED, 1, 0), *log[2:]]),
        "step-1 is recorded 2 times, not once",
    ),
    "a step never recorded": (
        with_log(lambda log: [*log[:4], log[5]]),
        "step-3 is recorded 0 times, not once",
    ),
    "a recorded step started again": (
        dataclasses.replace(KEPT, traces=(*KEPT.traces, Trace("step-1", RESTARTED, "start"))),
        f"step-1 was recorded by worker 1 (pid {KILLED}) and started again by worker 2 "
        f"(pid {RESTARTED})",
    ),
    "a step its recorder started twice": (
        dataclasses.replace(KEPT, traces=(*KEPT.traces, Trace("step-3", RESTARTED, "start"))),
        f"step-3: worker 2 (pid {RESTARTED}), whose record is in the log, started it 2 times",
    ),
    "an effect after the record": (
        dataclasses.replace(KEPT, counters={**KEPT.counters, "step-3": 2}),
        "step-3's counter is 2, but its recorded run left it at 1",
    ),
    "a result that is not the records'": (
        with_log(lambda log: [*log[:-1], event(EventKind.EXECUTION_COMPLETED, {"result": []}, 1)]),
        "the result [] is not the recorded steps' results",
    ),
    "a worker that saw another result": (
        dataclasses.replace(
            KEPT, workers=(KEPT.workers[0], dataclasses.replace(KEPT.workers[1], result=None))
        ),
        "the last worker saw None",
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN), ids=list(BROKEN))
def test_the_check_reports_each_broken_promise(broken: str) -> None:
    trial, expected = BROKEN[broken]
    found = violations(trial)
    assert any(expected in line for line in found), found
