"""The schedule explorer itself: its schedule count, its verdicts, and that it catches a
store whose conditional acquire ignores the park."""

import subprocess
import sys

import pytest
from loom_conformance import StorageFactory, explore, memory_factory
from loom_conformance.explorer import main, schedules

from loom_core import (
    FenceAcquired,
    FenceStale,
    InvalidOptionError,
    NewEvent,
    Storage,
    Unsupported,
)
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore
from loom_core.spi import ConditionalFence, check_execution_id

asyncio_test = pytest.mark.asyncio(loop_scope="function")


class TokenOnlyStore(MemoryEventStore):
    """Broken on purpose: compares the token but not the tail past ``park_seq`` (the
    token alone cannot see a committed resume), so a retry after a committed resume wins."""

    async def acquire_fence_if(
        self, execution_id: str, *, fence: int, park_seq: int
    ) -> ConditionalFence:
        execution_id = check_execution_id(execution_id)
        current = self._fences.get(execution_id, 0)
        if current != fence:
            return FenceStale(current)
        self._fences[execution_id] = current + 1
        return FenceAcquired(current + 1)


def token_only_factory() -> StorageFactory:
    async def open_broken() -> Storage:
        return Storage(TokenOnlyStore(), MemoryTimerStore(), MemoryLeaseStore())

    return open_broken


def test_schedules_are_every_word_over_a_and_b_up_to_ten_letters() -> None:
    words = list(schedules(10))
    assert len(words) == 2047
    assert len(set(words)) == 2047
    assert words[:4] == ["", "A", "B", "AA"]
    assert max(len(w) for w in words) == 10
    assert len(list(schedules(7))) == 255


@asyncio_test
async def test_conditional_acquire_has_no_violation_with_isolated_executions() -> None:
    report = await explore(memory_factory(), isolation="execution")
    assert report.summary == "2047 schedules, 0 violations"
    assert report.resumed > 0
    assert report.retried > 0


@asyncio_test
async def test_negative_control_reports_a_readable_example() -> None:
    report = await explore(memory_factory(), acquire="acquire_fence", max_steps=6)
    assert report.schedules == 127
    assert report.violations
    example = report.violations[0]
    assert example.schedule == "AABABA"
    text = example.explain()
    assert "fenced out" in text
    assert "A append EXECUTION_RESUMED under token 2: landed" in text
    assert "B acquire_fence -> token 3" in text


@asyncio_test
async def test_explorer_catches_a_conditional_acquire_that_ignores_the_park() -> None:
    """The interleaving that needs the park condition: B re-reads the park before A's
    resume lands and retries with the returned token after it; only the park condition
    refuses B. It takes all ten steps, which is why the exploration goes to n = 10."""
    report = await explore(token_only_factory())
    assert report.violations
    assert {v.rule for v in report.violations} == {
        "the winner's running body is never fenced out"
    }
    assert "AAAABBBABA" in {v.schedule for v in report.violations}
    assert not (await explore(token_only_factory(), max_steps=9)).violations


@asyncio_test
async def test_explorer_refuses_a_store_without_the_method() -> None:
    with pytest.raises(Unsupported, match="acquire_fence_if"):
        await explore(memory_factory(offer=("acquire_fence",)))


@asyncio_test
async def test_store_isolation_refuses_a_factory_whose_storage_keeps_what_it_held() -> None:
    # One file or database opened again on every call: each schedule finds the one
    # before's execution, as this store does from the start.
    async def open_the_same() -> Storage:
        events = MemoryEventStore()
        await events.append("explored", [NewEvent("k")], expected_sequence=0)
        return Storage(events, MemoryTimerStore(), MemoryLeaseStore())

    with pytest.raises(InvalidOptionError) as refused:
        await explore(open_the_same, max_steps=2, isolation="store")
    assert "already holds executions ('explored')" in str(refused.value)
    assert "loom_explorer_isolation" in str(refused.value)
    assert "isolation='execution'" in str(refused.value)


def test_command_prints_the_counts_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "acquire_fence_if: 2047 schedules, 0 violations" in out
    assert "negative control, unconditional acquire_fence: 2047 schedules, " in out
    assert "negative control, unconditional acquire_fence: 2047 schedules, 0 violations" not in out


def test_python_dash_m_runs_the_explorer() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "loom_conformance.explorer",
         "--steps", "6"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("acquire_fence_if: 127 schedules, 0 violations\n")
    control = "negative control, unconditional acquire_fence: 127 schedules, 6 violations"
    assert control in done.stdout


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["--url", "bogus://x"], "no backend is installed for the URL scheme 'bogus'"),
        (["--steps", "-3"], "--steps: must be a schedule length of 0 or more, not '-3'"),
        (["--steps", "ten"], "--steps: must be a schedule length of 0 or more, not 'ten'"),
    ],
)
def test_the_command_refuses_what_it_cannot_explore_in_one_line(
    arguments: list[str], says: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loom_conformance.explorer", *arguments],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
