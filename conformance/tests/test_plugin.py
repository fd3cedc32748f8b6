"""The plugin as a third party meets it: in another project, in auto mode, and failing a
store that breaks the contract."""

import pytest
from loom_conformance.requirements import REFUSAL_TEST

SUITES = """
from loom_conformance.suites import (
    TestEventStoreContract, TestLeaseStoreContract, TestTimerStoreContract,
)
"""

BROKEN_CONFTEST = """
import dataclasses

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


class Boastful(MemoryEventStore):
    @property
    def capabilities(self):
        return frozenset({"subscribe", "delete_execution"})


class OffByOne(MemoryEventStore):
    async def head(self, execution_id):
        return await super().head(execution_id) + 1


class NeverClosed(MemoryEventStore):
    async def close(self):
        return None


SHARED = NeverClosed()


class InclusiveAfter(MemoryEventStore):
    async def list_executions(self, *, after=None, limit=100):
        ids = sorted(i for i in self._logs if after is None or i >= after)
        return tuple(ids[:limit])


class ReadsAList(MemoryEventStore):
    async def read(self, execution_id, **kwargs):
        return list(await super().read(execution_id, **kwargs))


class StampsInPlace(MemoryEventStore):
    async def append(self, execution_id, events, **kwargs):
        for event in events:
            event.metadata["stamp"] = "in place"
        return await super().append(execution_id, events, **kwargs)


def _as_jsonb(value):
    # What PostgreSQL jsonb hands back: integral floats as integers, no negative zero,
    # an object's keys shortest first.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_as_jsonb(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_jsonb(value[k]) for k in sorted(value, key=lambda k: (len(k), k))}
    return value


class NormalisesJson(MemoryEventStore):
    async def read(self, execution_id, **kwargs):
        return tuple(
            dataclasses.replace(e, payload=_as_jsonb(e.payload))
            for e in await super().read(execution_id, **kwargs)
        )


def _unfenced(events):
    return tuple(
        dataclasses.replace(e, metadata={k: v for k, v in e.metadata.items() if k != "fence"})
        for e in events
    )


class ForgetsTheFence(MemoryEventStore):
    async def append(self, execution_id, events, **kwargs):
        return _unfenced(await super().append(execution_id, events, **kwargs))

    async def read(self, execution_id, **kwargs):
        return _unfenced(await super().read(execution_id, **kwargs))


STORES = {
    "forgets-the-fence": ForgetsTheFence,
    "normalises-json": NormalisesJson,
    "reads-a-list": ReadsAList,
    "stamps-in-place": StampsInPlace,
    "token-only": TokenOnly,
    "boastful": lambda: Boastful(offer=()),
    "off-by-one": OffByOne,
    "shared": lambda: SHARED,
    "inclusive-after": InclusiveAfter,
}


@pytest.fixture
def loom_storage_factory(request):
    make = STORES[request.config.getoption("--store")]

    async def open_broken():
        return Storage(make(), MemoryTimerStore(), MemoryLeaseStore())

    return open_broken


def pytest_addoption(parser):
    parser.addoption("--store")
"""


def test_suites_run_in_a_project_using_auto_mode(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-k", "not explorer")
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] > 100
    assert set(outcomes) == {"passed", "deselected"}, outcomes
    result.stdout.fnmatch_lines([
        "*loom-conformance: optional event-store methods*",
        "*acquire_fence_if*offered, contract run (1 store(s))",
    ])
    assert "NOT CHECKED" not in result.stdout.str()


def test_the_summary_shows_the_refused_branch_for_a_bare_store(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        "import pytest\n"
        "from loom_conformance import memory_factory\n"
        "@pytest.fixture\n"
        "def loom_storage_factory():\n"
        "    return memory_factory(offer=('subscribe',))\n"
    )
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-k", "offered_or")
    result.stdout.fnmatch_lines([
        "*append_many*not offered, Unsupported checked (1 store(s))",
        "*subscribe*offered, contract run (1 store(s))",
    ])


def test_every_skip_for_an_unoffered_method_names_the_refusal_test_that_ran(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        "import pytest\n"
        "from loom_conformance import memory_factory\n"
        "@pytest.fixture\n"
        "def loom_storage_factory():\n"
        "    return memory_factory(offer=('acquire_fence',))\n"
    )
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-rs", "-p", "no:cacheprovider", "-k", "TestEventStoreContract"
    )
    skips = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    assert skips, result.stdout.str()[-3000:]
    unexplained = [line for line in skips if REFUSAL_TEST not in line]
    assert not unexplained, unexplained


def test_a_conditional_acquire_that_ignores_the_park_fails_the_kit(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nasyncio_mode = strict\n")
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--store", "token-only",
        "-k", "answering_kind_past_the_park or retry_after_a_committed_resume or explorer",
    )
    outcomes = result.parseoutcomes()
    # Six answering kinds, the mixed tail, the committed-resume retry and the explorer.
    assert outcomes.get("failed") == 9, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*test_retry_after_a_committed_resume_is_stale*"])
    result.stdout.fnmatch_lines(["*breaks the rule: the winner's running body*"])


def test_capabilities_that_claim_an_unoffered_method_fail_the_kit(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--store", "boastful",
        "-k", "offered_or_refused",
    )
    outcomes = result.parseoutcomes()
    assert (outcomes.get("failed"), outcomes.get("passed")) == (2, 6), outcomes
    result.stdout.fnmatch_lines(["*offered_or_refused_with_unsupported?subscribe?*"])

NO_SHRINKING = """
from hypothesis import Phase, settings

settings.register_profile("no-shrinking", phases=[Phase.explicit, Phase.generate])
"""


def test_a_read_returning_a_list_is_named_as_a_wrong_return_type(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--store", "reads-a-list", "-k", "documented_types",
    )
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*read returned a list; the EventStore protocol returns a tuple*"])


def test_a_store_that_hands_back_equal_values_of_other_types_fails_the_kit(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--store", "normalises-json",
        "-k", "json_payload_and_metadata_round_trip or payload_values_read_back",
    )
    # Its values are equal to what was written, so the round-trip test passes it.
    outcomes = result.parseoutcomes()
    assert (outcomes.get("failed"), outcomes.get("passed")) == (1, 1), result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*read handed back payloads that are equal but not the same*"])


def test_a_drawn_call_answered_otherwise_names_each_field_of_the_events(
    pytester: pytest.Pytester,
) -> None:
    # The message is the same for the first failing program as for the shortest one:
    # shrinking would only take minutes here.
    pytester.makeconftest(BROKEN_CONFTEST + NO_SHRINKING)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--hypothesis-profile", "no-shrinking",
        "--store", "forgets-the-fence",
        "-k", "TestEventStoreContract and drawn_calls_answer_as_the_reference",
    )
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([
        "*after the program the store holds [[]Log(execution_id=*, head=*, events=(Event("
        "execution_id=*, sequence=*, kind=*, payload=*, fence=0)*token=*the reference*fence=1)*",
    ])


def test_an_append_that_writes_into_the_callers_events_is_named(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--store", "stamps-in-place", "-k", "it_was_given",
    )
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*append changed the events it was given*"])


def test_the_decorator_contract_can_be_restricted_by_name(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nloom_decorators = no-such-decorator\n")
    pytester.makepyfile(
        test_decorators="from loom_conformance.suites import TestDecoratorContract\n"
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*no decorator named 'no-such-decorator' is installed*"])
    assert result.ret != 0


def test_a_failing_kit_assertion_shows_the_values(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loaded by name, not from a distribution's file list: what an editable install gives
    # pytest, which then rewrites only the modules the kit registers itself.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "-p", "loom_conformance.plugin",
        "-p", "pytest_asyncio.plugin", "--store", "off-by-one", "-k", "head_is_the_next",
    )
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()[-3000:]
    # Rewritten: the compared values, not a bare AssertionError.
    result.stdout.fnmatch_lines(["*assert 1 == 0*"])


def test_a_shared_storage_is_named_as_the_cause_of_every_failure(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--store", "shared", "-k", "head or list_executions",
    )
    outcomes = result.parseoutcomes()
    # The first test passes on the empty store and leaves logs in it; every later one is
    # stopped at the fixture with the cause, before its own assertions can mislead.
    refused = outcomes.get("errors", 0)
    assert refused >= 2, outcomes
    assert result.stdout.str().count("must open a fresh, empty storage") >= refused
    result.stdout.fnmatch_lines(["*loom_storage_factory returned a storage that already holds*"])


def test_an_inclusive_after_fails_the_paging_test_instead_of_hanging(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_store=SUITES)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--store", "inclusive-after", "-k", "pages_cover",
        timeout=120,
    )
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*`after` is exclusive, so paging would repeat forever*"])


BROKEN_DECORATORS_CONFTEST = """
from loom_core import Storage
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator, Refuse, hookimpl
from loom_core.spi import default_plugins


class Liar(EventStoreDecorator):
    decisions = Decisions(
        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
        append_many=FORWARD, delete_execution=Refuse("liars keep logs"), copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
    )

    @property
    def capabilities(self):
        return super().capabilities | {"delete_execution"}


class Plain(EventStoreDecorator):
    decisions = Decisions(
        acquire_fence=FORWARD, acquire_fence_if=FORWARD, append_if_unchanged=FORWARD,
        append_many=FORWARD, delete_execution=FORWARD, copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD, subscribe=FORWARD,
    )


class Wrapping:
    def __init__(self, name, wrap, closes=True):
        self.name = name
        self._wrap = wrap
        self._closes = closes

    async def decorate(self, storage, options):
        return Storage(self._wrap(storage.events), storage.timers, storage.leases,
                       url=storage.url, on_close=storage.close if self._closes else None)

    async def conformance_options(self, open_inner):
        return {}


class Plugin:
    @hookimpl
    def loom_register_decorators(self, registry):
        registry.add_decorator(Wrapping("liar", Liar))
        registry.add_decorator(Wrapping("unwrapped", lambda events: events))
        registry.add_decorator(Wrapping("leaky", Plain, closes=False))
        registry.add_decorator(Wrapping("lax", Plain))  # takes any option, as they all do


default_plugins().register(Plugin(), name="broken-decorators", source="broken decorators")
"""


@pytest.mark.parametrize(
    ("decorator", "failing", "message"),
    [
        ("liar", "test_every_offered_method_is_served_not_refused",
         "*offered in capabilities but refused when called*delete_execution*"),
        ("unwrapped", "test_decorator_returns_an_event_store_decorator",
         "*which is not an EventStoreDecorator*"),
        ("leaky", "test_closing_the_decorated_storage_closes_the_storage_it_was_given",
         "*did not close the storage its decorate() was given*"),
        ("lax", "test_an_unknown_option_is_refused_with_invalid_option_error",
         "*accepted the unknown option 'loom-kit-no-such-option'*"),
    ],
)
def test_a_broken_decorator_fails_the_decorator_contract(
    pytester: pytest.Pytester, decorator: str, failing: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\nloom_decorators = {decorator}\n")
    pytester.makeconftest(BROKEN_DECORATORS_CONFTEST)
    pytester.makepyfile(
        test_decorators="from loom_conformance.suites import TestDecoratorContract\n"
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-k", failing)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([message])
