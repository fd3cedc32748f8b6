"""The runtime suite is optional: the kit runs without loom-runtime, and a project that
asks for the suite without it fails under CI and skips, saying why, elsewhere."""

import pytest

BLOCK_RUNTIME = """
import sys

# As if loom-runtime were not installed: importing it raises ModuleNotFoundError.
sys.modules["loom_runtime"] = None
"""

KIT_ONLY = """
from loom_conformance.suites import TestTimerStoreContract
"""

RUNTIME_SUITE = """
from loom_conformance.suites.runtime import TestRuntimeContract
"""

INSTALL = "pip install ./conformance ./runtime (or, from an index that has both, pip install 'loom-conformance[runtime]')"  # noqa: E501


def test_the_kit_runs_without_loom_runtime(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(BLOCK_RUNTIME)
    pytester.makepyfile(test_store=KIT_ONLY)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) > 10, result.stdout.str()[-3000:]
    assert set(outcomes) == {"passed"}, outcomes


def test_asking_for_the_runtime_suite_without_loom_runtime_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makeconftest(BLOCK_RUNTIME)
    pytester.makepyfile(test_store=KIT_ONLY + RUNTIME_SUITE)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    assert result.ret != 0
    out = result.stdout.str()
    assert result.parseoutcomes().get("errors") == 1, out[-3000:]
    assert "ModuleNotFoundError: the runtime contract suite" in out
    assert "needs loom-runtime, which cannot be imported" in out
    assert INSTALL in out


def test_asking_for_the_runtime_suite_without_loom_runtime_skips_outside_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    pytester.makeconftest(BLOCK_RUNTIME)
    pytester.makepyfile(test_store=RUNTIME_SUITE)
    result = pytester.runpytest_subprocess("-q", "-rs", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.parseoutcomes() == {"skipped": 1}, out[-3000:]
    (reason,) = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert "needs loom-runtime" in reason
    assert f"{INSTALL} (under CI=true this fails the run)" in reason


def test_the_runtime_suite_runs_in_a_project_using_auto_mode(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    pytester.makepyfile(test_store=RUNTIME_SUITE)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 20, result.stdout.str()[-3000:]
    assert set(outcomes) == {"passed"}, outcomes


TOKEN_ONLY_CONFTEST = """
import pytest
from loom_core import FenceAcquired, FenceStale, Storage
from loom_core.memory import MemoryEventStore, MemoryLeaseStore, MemoryTimerStore


class TokenOnly(MemoryEventStore):
    async def acquire_fence_if(self, execution_id, *, fence, park_seq):
        current = self._fences.get(execution_id, 0)
        if current != fence:
            return FenceStale(current)
        self._fences[execution_id] = current + 1
        return FenceAcquired(current + 1)


@pytest.fixture
def loom_storage_factory():
    async def open_broken():
        return Storage(TokenOnly(), MemoryTimerStore(), MemoryLeaseStore())
    return open_broken
"""


def test_a_conditional_acquire_that_ignores_the_park_fails_the_runtime_suite(
    pytester: pytest.Pytester,
) -> None:
    """A rival answers under the park's own token: only the park condition can refuse the
    loser's acquire, and a store that checks the token alone hands the loser a token."""
    pytester.makeconftest(TOKEN_ONLY_CONFTEST)
    pytester.makepyfile(test_store=RUNTIME_SUITE)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*FAILED*loses_the_race*rival-leaving-the-token*"])
