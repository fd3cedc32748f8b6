"""``TestRuntimeContract``: real workflows through ``loom_runtime.Loom`` on the store under
test, so a store proves it carries the runtime, not only the event-store contract.

Import it beside the other suites; it runs on whatever ``loom_storage_factory`` opens::

    from loom_conformance.suites.runtime import TestRuntimeContract

It needs ``loom-runtime`` (``pip install 'loom-conformance[runtime]'``). Without it,
importing this module fails the run under ``CI=true`` and skips the module, with that
reason, elsewhere: a suite that was asked for never passes by not running.

Every app runs on a :class:`~loom_runtime.testing.VirtualClock` with a seeded random and
no background services: the tests move the clock and poll the timer service themselves, so
a real store's I/O never races the clock. Races are forced, never hoped for: a rival that
takes the fence is put in front of each conditional acquire by
:class:`~loom_conformance.suites._interposed.InterposedEventStore`. Tests that need an
optional method carry its switch (:mod:`loom_conformance.requirements`); the runtime's
fallbacks are driven on every store by withholding the optional methods from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from random import Random
from typing import TYPE_CHECKING, Any, Final, Literal

import pytest
import pytest_asyncio
from hypothesis import given

from loom_conformance.ci import in_ci
from loom_conformance.requirements import requires
from loom_conformance.suites._interposed import InterposedEventStore
from loom_conformance.suites._support import (
    drawn_settings,
    field_of,
    guard,
    snapshot,
    token_of,
)
from loom_core import Event, EventKind, EventStore, Storage, TimerRecord

if TYPE_CHECKING:
    from loom_core.spi import OptionalMethod

try:
    from loom_runtime import (
        Context,
        ExecutionCancelledError,
        ExecutionTimedOutError,
        Handle,
        Loom,
        ReplayDivergedError,
        ResumeContendedError,
        ResumeRefusedError,
    )
    from loom_runtime.testing import VirtualClock, check_replay, crash_at

    from loom_conformance.drawn_workflows import (
        Plan,
        check_plan,
        drawn_app,
        plans,
        with_chosen_plans,
    )
except ImportError as missing:  # conformance/tests/test_runtime_suite.py runs this branch
    _reason = (
        "the runtime contract suite (loom_conformance.suites.runtime) needs loom-runtime, "
        f"which cannot be imported ({missing}); install it beside the kit, from a checkout "
        "of Loom: pip install ./conformance ./runtime (or, from an index that has both, "
        "pip install 'loom-conformance[runtime]')"
    )
    if in_ci():
        raise ModuleNotFoundError(_reason, name="loom_runtime") from missing
    pytest.skip(f"{_reason} (under CI=true this fails the run)", allow_module_level=True)

__all__ = ["TestRuntimeContract"]

NODE: Final = "kit-node-1"
RIVAL_NODE: Final = "kit-node-2"
SEED: Final = 7

RESULT_GUARD_SECONDS: Final = 30.0
"""How long a test waits for a result before calling the run hung. A guard against
hanging the run, never an assertion about speed."""

DRAWN_EXAMPLES: Final = 40
"""Drawn workflows per run of the suite (the same ones every run)."""
_DRAWN_IDS: Final = itertools.count()

WITHOUT_CONDITIONAL: Final[tuple[OptionalMethod, ...]] = ("acquire_fence_if",)
WITHOUT_FENCING: Final[tuple[OptionalMethod, ...]] = ("acquire_fence", "acquire_fence_if")


@dataclass(slots=True)
class RuntimeNode:
    """One running app (a node) on the store under test, the clock it runs on, and what
    it reported to ``on_error`` (a test that expects a report takes it out)."""

    storage: Storage
    app: Loom
    clock: VirtualClock
    reported: list[BaseException] = field(default_factory=list)

    @property
    def events(self) -> EventStore:
        return self.storage.events

    async def fire_timers(self, seconds: float) -> Mapping[TimerRecord, str]:
        """Move the clock on by ``seconds``, fire what is due (one poll of the timer
        service) and wait until every run that woke has finished or parked again."""
        await self.clock.advance(seconds)
        fired = await self.app.timer_service.poll_once()
        await self.settled()
        return fired

    async def settled(self) -> None:
        """Wait until every run of this app has finished or parked."""
        await guard(self.app.drain())

    async def log(self, execution_id: str) -> tuple[Event, ...]:
        return await self.events.read(execution_id)

    async def kinds(self, execution_id: str) -> list[str]:
        return [event.kind for event in await self.log(execution_id)]

    async def park_of(self, execution_id: str) -> int:
        """The sequence of the execution's open park (fails if it is not parked)."""
        view = await self.app.inspect(execution_id)
        assert view.park is not None, f"{execution_id!r} is {view.status}, not parked"
        return view.park.sequence

    async def start_nap(self, execution_id: str) -> tuple[Handle[str], int]:
        """Start :func:`nap` as ``execution_id``, wait until it has parked on its sleep,
        and give its handle and the sequence of its park."""
        handle = await self.app.start(self.app.workflow(name="nap")(nap), id=execution_id)
        await self.settled()
        return handle, await self.park_of(execution_id)


async def nap(ctx: Context) -> str:
    """The suite's parked execution: sleeps 30 s, then answers "awake"."""
    await ctx.sleep(30)
    return "awake"


@contextlib.asynccontextmanager
async def running_app(
    storage: Storage, *, clock: VirtualClock | None = None, node: str = NODE
) -> AsyncIterator[RuntimeNode]:
    """``Loom(storage)`` entered, on a virtual clock, a seeded random and no background
    services (no timer loop, no recovery on entry): the test drives both."""
    clock = clock if clock is not None else VirtualClock()
    reported: list[BaseException] = []
    app = Loom(
        storage, node=node, clock=clock, random=Random(SEED), on_error=reported.append,
        timers=False, recover=False,
    )
    async with app:
        yield RuntimeNode(storage, app, clock, reported)


def interposed(
    storage: Storage,
    *,
    withhold: Collection[OptionalMethod] = (),
    before_acquire_if: Callable[[str], Awaitable[None]] | None = None,
) -> tuple[Storage, InterposedEventStore]:
    """``storage`` with an :class:`InterposedEventStore` in front of its event store.
    Never closed itself: closing ``storage`` (the kit does) is enough."""
    events = InterposedEventStore(
        storage.events, withhold=withhold, before_acquire_if=before_acquire_if
    )
    return Storage(events, storage.timers, storage.leases, url=storage.url), events


async def result(handle: Handle[Any]) -> Any:
    return await handle.result(timeout=RESULT_GUARD_SECONDS)


def assert_gapless(log: tuple[Event, ...]) -> None:
    sequences = [event.sequence for event in log]
    assert sequences == list(range(len(log))), f"the log has gaps: sequences {sequences}"


def answers(log: tuple[Event, ...]) -> list[Event]:
    return [event for event in log if event.kind == EventKind.EXECUTION_RESUMED]


class _Counter:
    """Counts the live runs of each named step (a replayed step is not run)."""

    def __init__(self) -> None:
        self.ran: dict[str, int] = {}

    def step(self, name: str, value: Any = None) -> Callable[[], Awaitable[Any]]:
        async def run() -> Any:
            self.ran[name] = self.ran.get(name, 0) + 1
            return value if value is not None else name

        run.__qualname__ = name
        return run


class _Held:
    """An ``append`` hook of :class:`InterposedEventStore` that holds the first append of
    one of ``kinds`` until released, and says when it holds one."""

    def __init__(self, *kinds: str) -> None:
        self.kinds = frozenset(kinds)
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, execution_id: str, written: tuple[str, ...]) -> None:
        if self.kinds.intersection(written) and not self.release.is_set():
            self.holding.set()
            await self.release.wait()

    async def cancel(self, call: asyncio.Task[Any]) -> None:
        """Cancel ``call`` while its append is held, then let every append through."""
        await guard(self.holding.wait())
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        self.release.set()


Change = Literal["renamed", "reordered", "removed"]
CHANGES: Final[tuple[Change, ...]] = ("renamed", "reordered", "removed")
DIVERGES_AT: Final[dict[Change, str]] = {"renamed": "1", "reordered": "0", "removed": "1"}
"""The position each change of ``reserve, charge[, sleep], ship`` is caught at."""


def changed_steps(change: Change) -> list[str]:
    return {
        "renamed": ["reserve", "charge-card", "ship"],
        "reordered": ["charge", "reserve", "ship"],
        "removed": ["reserve", "ship"],
    }[change]


class TestRuntimeContract:
    """Workflows on the store under test: steps run once, crash recovery with a gapless
    log, durable timers, messages delivered once, the conditional resume against answered
    parks, dead acquirers and rivals, replay divergence, cancellation, continue-as-new and
    the runtime's fallbacks where optional methods are absent; ``check_replay`` passes for
    every execution a test finishes."""

    pytestmark = pytest.mark.asyncio(loop_scope="function")

    @pytest_asyncio.fixture(loop_scope="function")
    async def loom_node(self, loom_storage: Storage) -> AsyncIterator[RuntimeNode]:
        """An app on the store under test; after the test, nothing may be left reported."""
        async with running_app(loom_storage) as node:
            yield node
        assert not node.reported, f"the runtime reported failures nobody raised: {node.reported!r}"

    # -- steps and recovery ---------------------------------------------------------------

    async def test_a_multi_step_workflow_completes_and_runs_each_step_once(
        self, loom_node: RuntimeNode
    ) -> None:
        app, counter = loom_node.app, _Counter()

        def weigh(order: str) -> int:  # a plain function: the runtime runs it in a thread
            counter.ran["weigh"] = counter.ran.get("weigh", 0) + 1
            return len(order)

        @app.workflow(name="checkout")
        async def checkout(ctx: Context, order: str) -> dict[str, Any]:
            reserved = await ctx.step(counter.step("reserve", {"sku": order}), name="reserve")
            weight = await ctx.step(weigh, order, name="weigh")
            charged = await ctx.step(counter.step("charge"), name="charge")
            return {"reserved": reserved, "weight": weight, "charged": charged}

        handle = await app.start(checkout, "o-42", id="order-42")
        assert await result(handle) == {
            "reserved": {"sku": "o-42"}, "weight": 4, "charged": "charge",
        }
        assert counter.ran == {"reserve": 1, "weigh": 1, "charge": 1}
        assert await handle.status() == "completed"
        log = await loom_node.log("order-42")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.STEP_COMPLETED,
            EventKind.STEP_COMPLETED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert_gapless(log)
        assert await loom_node.events.head("order-42") == len(log)
        assert await check_replay(app) == ["order-42"]
        assert counter.ran == {"reserve": 1, "weigh": 1, "charge": 1}

    @pytest.mark.parametrize("when", ["before", "after"])
    async def test_a_crashed_run_is_recovered_without_running_a_recorded_step_again(
        self, loom_node: RuntimeNode, when: Literal["before", "after"]
    ) -> None:
        app, counter = loom_node.app, _Counter()

        @app.workflow(name="fulfil")
        async def fulfil(ctx: Context) -> list[str]:
            return [
                await ctx.step(counter.step("reserve"), name="reserve"),
                await ctx.step(counter.step("charge"), name="charge"),
                await ctx.step(counter.step("ship"), name="ship"),
            ]

        crash = crash_at(app, step="charge", when=when)
        handle = await app.start(fulfil, id="order-7")
        await guard(crash.fired.wait())
        await loom_node.settled()
        assert await handle.status() == "running"  # the log still says so: a dead process
        assert counter.ran == ({"reserve": 1} if when == "before" else
                               {"reserve": 1, "charge": 1})
        crashed = await loom_node.log("order-7")

        recovered = await app.recover()
        assert [h.execution_id for h in recovered] == ["order-7"]
        assert await result(handle) == ["reserve", "charge", "ship"]
        assert counter.ran == {"reserve": 1, "charge": 1, "ship": 1}
        log = await loom_node.log("order-7")
        assert log[: len(crashed)] == crashed
        assert_gapless(log)
        taken = [e for e in log if e.kind == EventKind.EXECUTION_RECOVERED]
        assert len(taken) == 1
        assert all(e.fence >= taken[0].fence for e in log[taken[0].sequence:])
        assert await check_replay(app) == ["order-7"]

    async def test_recoveries_that_never_get_further_fail_the_execution(
        self, loom_node: RuntimeNode
    ) -> None:
        """A run that dies before its first write, recovered ``max_recoveries`` times in a
        row: the next recovery appends EXECUTION_FAILED under a fresh token instead of
        running the body, and the failure is what the store gives back."""
        app = loom_node.app

        @app.workflow(name="kit.poisoned", max_recoveries=2)
        async def poisoned(ctx: Context) -> str:
            return await ctx.step(lambda: "never", name="poison")

        crash = crash_at(app, step="poison", times=3, execution_id="kit-poisoned")
        handle = await app.start(poisoned, id="kit-poisoned")
        await loom_node.settled()
        for _ in range(2):
            assert [h.execution_id for h in await app.recover()] == ["kit-poisoned"]
            await loom_node.settled()
        assert crash.count == 3
        assert await app.recover() == []
        log = await loom_node.log("kit-poisoned")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_RECOVERED,
            EventKind.EXECUTION_RECOVERED,
            EventKind.EXECUTION_FAILED,
        ]
        if "acquire_fence" in loom_node.events.capabilities:
            assert log[-1].fence > log[-2].fence  # under a token of its own
        assert_gapless(log)
        view = await app.inspect("kit-poisoned")
        assert view.error is not None
        assert view.error[0] == "loom_runtime.errors.RecoveryLimitError"
        assert await handle.status() == "failed"
        assert [type(e).__name__ for e in loom_node.reported] == ["RecoveryLimitError"]
        loom_node.reported.clear()

    async def test_an_executed_workflow_whose_caller_is_cancelled_is_taken_over(
        self, loom_node: RuntimeNode
    ) -> None:
        """``app.execute`` drives the body in the caller's task; cancelling that task
        mid-step leaves the execution to the app, which takes a fresh token, records the
        takeover and replays: the recorded step is served, the cut one runs again."""
        app, counter = loom_node.app, _Counter()
        entered, gate = asyncio.Event(), asyncio.Event()

        async def ship() -> str:
            counter.ran["ship"] = counter.ran.get("ship", 0) + 1
            entered.set()
            await gate.wait()
            return "ship"

        @app.workflow(name="fulfil")
        async def fulfil(ctx: Context) -> list[str]:
            return [
                await ctx.step(counter.step("reserve"), name="reserve"),
                await ctx.step(ship, name="ship"),
            ]

        call = asyncio.create_task(app.execute(fulfil, id="order-8"))
        await guard(entered.wait())
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        gate.set()
        assert await result(app.get("order-8")) == ["reserve", "ship"]
        assert counter.ran == {"reserve": 1, "ship": 2}
        log = await loom_node.log("order-8")
        assert_gapless(log)
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_RECOVERED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_COMPLETED,
        ]
        taken = log[2]
        if "acquire_fence" in loom_node.events.capabilities:  # a fresh token, else the same
            assert taken.fence > log[1].fence
        assert all(e.fence == taken.fence for e in log[2:])
        assert await check_replay(app) == ["order-8"]

    # -- calls cancelled with a write in flight ----------------------------------------

    @pytest.mark.parametrize("call", ["start", "execute"])
    @pytest.mark.parametrize(
        "withheld", [(), WITHOUT_FENCING], ids=["as-offered", "without-acquire_fence"]
    )
    async def test_a_call_cancelled_once_its_first_write_landed_leaves_it_driven(
        self,
        loom_node: RuntimeNode,
        call: Literal["start", "execute"],
        withheld: tuple[OptionalMethod, ...],
    ) -> None:
        """The store wrote EXECUTION_STARTED and the caller was cancelled before it heard
        back: the execution is running in the log with no one driving it, so the app takes
        it over as a restarted node would (a fresh token first, where the store offers
        one) and the body runs once."""
        counter = _Counter()
        wrapped, seen = interposed(loom_node.storage, withhold=withheld)
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app

            @app.workflow(name="charge")
            async def charge(ctx: Context) -> str:
                return await ctx.step(counter.step("charge"), name="charge")

            held = _Held(EventKind.EXECUTION_STARTED)
            seen.after_append = held
            begun = app.start(charge, id="cut-1") if call == "start" else app.execute(
                charge, id="cut-1"
            )
            await held.cancel(asyncio.ensure_future(begun))
            assert await result(app.get("cut-1")) == "charge"
            assert counter.ran == {"charge": 1}
            log = await node.log("cut-1")
            assert [e.kind for e in log] == [
                EventKind.EXECUTION_STARTED,
                EventKind.EXECUTION_RECOVERED,
                EventKind.STEP_COMPLETED,
                EventKind.EXECUTION_COMPLETED,
            ]
            assert_gapless(log)
            if "acquire_fence" in wrapped.events.capabilities:
                assert log[1].fence > log[0].fence
            assert await check_replay(app) == ["cut-1"]
            assert node.reported == []

    async def test_a_start_cancelled_before_its_write_reached_the_store_leaves_the_id_free(
        self, loom_node: RuntimeNode
    ) -> None:
        """The caller was cancelled before its first write reached the store: nothing is
        written, and a later start takes the id (under a token newer than any the app
        took while making sure the write would never land)."""
        wrapped, seen = interposed(loom_node.storage)
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app

            @app.workflow(name="done")
            async def done(ctx: Context) -> str:
                return "done"

            held = _Held(EventKind.EXECUTION_STARTED)
            seen.before_append = held
            await held.cancel(asyncio.ensure_future(app.start(done, id="cut-2")))
            await node.settled()
            assert await node.events.head("cut-2") == 0
            seen.before_append = None
            assert await result(await app.start(done, id="cut-2")) == "done"
            assert await node.kinds("cut-2") == [
                EventKind.EXECUTION_STARTED, EventKind.EXECUTION_COMPLETED,
            ]
            assert node.reported == []

    async def test_a_send_cancelled_once_its_answer_landed_leaves_the_receiver_driven(
        self, loom_node: RuntimeNode
    ) -> None:
        """The message's delivery to a parked receiver (MESSAGE_CONSUMED and
        EXECUTION_RESUMED) was written and the sender cancelled before it heard back: the
        app drives the receiver on, and the message is consumed once."""
        wrapped, seen = interposed(loom_node.storage)
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app

            @app.workflow(name="listen")
            async def listen(ctx: Context) -> object:
                return await ctx.receive("go", timeout=600)

            handle = await app.start(listen, id="cut-3")
            await node.settled()
            assert await handle.status() == "suspended"
            held = _Held(EventKind.EXECUTION_RESUMED)
            seen.after_append = held
            await held.cancel(asyncio.ensure_future(app.send("cut-3", "go", {"n": 1})))
            assert await result(handle) == {"n": 1}
            log = await node.log("cut-3")
            assert [e.kind for e in log].count(EventKind.MESSAGE_CONSUMED) == 1
            assert len(answers(log)) == 1
            assert_gapless(log)
            assert await check_replay(app) == ["cut-3"]
            assert node.reported == []

    async def test_an_execute_cancelled_as_it_continues_leaves_its_successor_driven(
        self, loom_node: RuntimeNode
    ) -> None:
        """EXECUTION_CONTINUED was written and the caller cancelled before it heard back:
        the successor, created but not yet driven, is taken over and finishes."""
        wrapped, seen = interposed(loom_node.storage)
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app

            @app.workflow(name="relay")
            async def relay(ctx: Context, generation: int) -> int:
                if generation == 0:
                    ctx.continue_as_new(1)
                return generation

            held = _Held(EventKind.EXECUTION_CONTINUED)
            seen.after_append = held
            await held.cancel(asyncio.ensure_future(app.execute(relay, 0, id="cut-4")))
            assert await result(app.get("cut-4")) == 1
            assert await app.get("cut-4#1").status() == "completed"
            assert await node.kinds("cut-4") == [
                EventKind.EXECUTION_STARTED, EventKind.EXECUTION_CONTINUED,
            ]
            assert await check_replay(app) == ["cut-4", "cut-4#1"]
            assert node.reported == []

    # -- timers -------------------------------------------------------------------------

    async def test_a_sleep_parks_writes_its_timer_and_fires_when_the_clock_gets_there(
        self, loom_node: RuntimeNode
    ) -> None:
        app, timers = loom_node.app, loom_node.storage.timers
        wake_at = loom_node.clock.now() + timedelta(seconds=30)
        handle, _ = await loom_node.start_nap("nap-1")
        assert await handle.status() == "suspended"
        assert await timers.pending("nap-1") == (TimerRecord("nap-1", wake_at),)
        parked = await loom_node.log("nap-1")
        # Replayed up to its park, reading through your store and writing nothing.
        assert await check_replay(app) == ["nap-1"]
        assert await loom_node.log("nap-1") == parked

        assert await loom_node.fire_timers(29) == {}
        assert await handle.status() == "suspended"
        assert await loom_node.fire_timers(1) == {TimerRecord("nap-1", wake_at): "resumed"}
        assert await result(handle) == "awake"
        assert await timers.pending("nap-1") == ()
        log = await loom_node.log("nap-1")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_RESUMED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert_gapless(log)
        assert await check_replay(app) == ["nap-1"]

    # -- messages -----------------------------------------------------------------------

    async def test_a_message_to_a_parked_receive_is_delivered_once(
        self, loom_node: RuntimeNode
    ) -> None:
        app = loom_node.app

        @app.workflow(name="approval")
        async def approval(ctx: Context) -> Any:
            return await ctx.receive("approved")

        handle = await app.start(approval, id="req-1")
        await loom_node.settled()
        assert await handle.status() == "suspended"
        await app.send("req-1", "approved", {"by": "ops"})
        assert await result(handle) == {"by": "ops"}
        log = await loom_node.log("req-1")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.MESSAGE_CONSUMED,
            EventKind.EXECUTION_RESUMED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert_gapless(log)
        assert await check_replay(app) == ["req-1"]

    async def test_a_receive_any_takes_the_first_message_on_its_topics(
        self, loom_node: RuntimeNode
    ) -> None:
        """A parked ``receive_any`` wakes for a message on any topic it lists, not for
        one on another topic; the message left over stays for a later receive."""
        app = loom_node.app

        @app.workflow(name="review")
        async def review(ctx: Context) -> Any:
            first = await ctx.receive_any("approve", "reject")
            rest = await ctx.receive("other")
            return [list(first) if first is not None else None, rest]

        handle = await app.start(review, id="rev-1")
        await loom_node.settled()
        await app.send("rev-1", "other", 1)
        await loom_node.settled()
        assert await handle.status() == "suspended"  # "other" is not one of its topics
        await app.send("rev-1", "reject", {"by": "ann"})
        assert await result(handle) == [["reject", {"by": "ann"}], 1]
        log = await loom_node.log("rev-1")
        taken = [e.payload for e in log if e.kind == EventKind.MESSAGE_CONSUMED]
        assert [p["topic"] for p in taken] == ["reject", "other"]  # type: ignore[index,call-overload]
        assert_gapless(log)
        assert await check_replay(app) == ["rev-1"]

    async def test_the_app_lists_its_executions_and_not_their_inboxes(
        self, loom_node: RuntimeNode
    ) -> None:
        """``app.executions`` pages the store's listing: every execution in id order with
        its status, filtered, and never an inbox stream."""
        app = loom_node.app

        @app.workflow(name="kit.listed")
        async def listed(ctx: Context, wait: bool) -> Any:
            return await ctx.receive("go") if wait else "done"

        for k in (3, 1, 2):
            await app.execute(listed, False, id=f"kit-list-{k}")
        parked = await app.start(listed, True, id="kit-list-0")
        await loom_node.settled()
        await app.send("kit-list-2", "late", 1)  # an inbox for a finished one, not listed
        assert await parked.status() == "suspended"
        found = [(v.execution_id, v.status) async for v in app.executions(workflow="kit.listed")]
        assert found == [
            ("kit-list-0", "suspended"),
            ("kit-list-1", "completed"),
            ("kit-list-2", "completed"),
            ("kit-list-3", "completed"),
        ]
        suspended = app.executions(workflow="kit.listed", status="suspended")
        assert [v.execution_id async for v in suspended] == ["kit-list-0"]
        await app.send("kit-list-0", "go", 2)
        assert await result(parked) == 2

    async def test_a_message_sent_before_the_receive_is_waiting_for_it(
        self, loom_node: RuntimeNode
    ) -> None:
        app = loom_node.app

        @app.workflow(name="late-reader")
        async def late_reader(ctx: Context) -> Any:
            await ctx.sleep(10)
            return await ctx.receive("note")

        handle = await app.start(late_reader, id="reader-1")
        await loom_node.settled()
        await app.send("reader-1", "note", "early")
        await loom_node.settled()
        assert await handle.status() == "suspended"  # still asleep; the message waits
        await loom_node.fire_timers(10)
        assert await result(handle) == "early"
        log = await loom_node.log("reader-1")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_RESUMED,
            EventKind.MESSAGE_CONSUMED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert await check_replay(app) == ["reader-1"]

    async def test_a_repeated_send_with_one_key_is_one_message(
        self, loom_node: RuntimeNode
    ) -> None:
        app = loom_node.app

        @app.workflow(name="payments")
        async def payments(ctx: Context) -> list[Any]:
            first = await ctx.receive("paid")
            second = await ctx.receive("paid", timeout=5)
            return [first, second]

        handle = await app.start(payments, id="pay-1")
        await loom_node.settled()
        sent = await app.send("pay-1", "paid", 100, key="invoice-9")
        assert await app.send("pay-1", "paid", 100, key="invoice-9") == sent
        await loom_node.settled()
        assert await handle.status() == "suspended"  # the second receive found nothing
        await loom_node.fire_timers(5)
        assert await result(handle) == [100, None]
        kinds = await loom_node.kinds("pay-1")
        assert kinds.count(EventKind.MESSAGE_CONSUMED) == 1
        assert await check_replay(app) == ["pay-1"]

    async def test_a_message_sent_at_the_instant_an_answered_timer_fired_is_delivered(
        self, loom_node: RuntimeNode
    ) -> None:
        """The sender's wake row shares the instant of the answered sleep: it must not be
        taken for that sleep's row and retired with the message still waiting."""
        app = loom_node.app

        @app.workflow(name="sleep-then-read")
        async def sleep_then_read(ctx: Context) -> Any:
            await ctx.sleep(30)
            return await ctx.receive("note")

        handle = await app.start(sleep_then_read, id="reader-2")
        await loom_node.settled()
        await loom_node.fire_timers(30)
        assert await handle.status() == "suspended"  # now on the receive
        await app.send("reader-2", "note", "on time")
        await loom_node.settled()
        assert await handle.status() == "completed"
        assert await result(handle) == "on time"
        assert await check_replay(app) == ["reader-2"]

    # -- resuming -----------------------------------------------------------------------

    async def test_resuming_an_answered_park_is_refused_and_changes_nothing(
        self, loom_node: RuntimeNode
    ) -> None:
        app, events = loom_node.app, loom_node.events

        @app.workflow(name="two-parks")
        async def two_parks(ctx: Context) -> Any:
            value = await ctx.receive("go")
            await ctx.sleep(60)
            return value

        handle = await app.start(two_parks, id="parks-1")
        await loom_node.settled()
        first = await loom_node.park_of("parks-1")
        await app.send("parks-1", "go", "yes")
        await loom_node.settled()
        second = await loom_node.park_of("parks-1")
        assert second > first

        before, token = await snapshot(events), await token_of(events, "parks-1")
        with pytest.raises(ResumeRefusedError) as refused:
            await app.resume("parks-1", fence_if_parked_at=first)
        assert refused.value.reason == "not-suspended"
        assert refused.value.execution_id == "parks-1"
        assert await snapshot(events) == before
        assert await token_of(events, "parks-1") == token

        await app.resume("parks-1", fence_if_parked_at=second)  # wakes the sleep early
        assert await result(handle) == "yes"
        finished, token = await snapshot(events), await token_of(events, "parks-1")
        with pytest.raises(ResumeRefusedError) as refused:
            await app.resume("parks-1", fence_if_parked_at=second)
        assert refused.value.reason == "not-suspended"
        assert await snapshot(events) == finished
        assert await token_of(events, "parks-1") == token
        assert await check_replay(app) == ["parks-1"]

    @pytest.mark.parametrize(
        "rival_withholds", [(), WITHOUT_FENCING],
        ids=["fencing-rival", "rival-leaving-the-token"],
    )
    @requires.acquire_fence_if
    async def test_a_resume_that_loses_the_race_is_refused_and_takes_no_token(
        self, loom_node: RuntimeNode, rival_withholds: tuple[OptionalMethod, ...]
    ) -> None:
        """A rival answers the park between our read of it and our conditional acquire:
        the acquire is stale, the re-read shows the park answered, and ours is refused
        without writing or taking a token. A rival without the acquire methods answers
        under the park's own token, so the token alone cannot refuse us: only the
        store's park condition (an answer past the park) does."""
        storage, clock = loom_node.storage, loom_node.clock
        rival_storage, _ = interposed(storage, withhold=rival_withholds)
        async with running_app(rival_storage, clock=clock, node=RIVAL_NODE) as rival:
            rival.app.workflow(name="nap")(nap)
            handle, park = await loom_node.start_nap("nap-race")
            rival_tokens: list[int] = []

            async def rival_answers_first(execution_id: str) -> None:
                raced.before_acquire_if = None
                await rival.app.resume(execution_id, fence_if_parked_at=park)
                await rival.settled()
                rival_tokens.append(await token_of(storage.events, execution_id))

            wrapped, raced = interposed(storage, before_acquire_if=rival_answers_first)
            async with running_app(wrapped, clock=clock) as ours:
                ours.app.workflow(name="nap")(nap)
                with pytest.raises(ResumeRefusedError) as refused:
                    await ours.app.resume("nap-race", fence_if_parked_at=park)
                assert refused.value.reason == "not-suspended"
                assert ours.reported == []
            assert await result(handle) == "awake"
            log = await loom_node.log("nap-race")
            assert len(answers(log)) == 1
            assert field_of(answers(log)[0], "node") == RIVAL_NODE
            assert await token_of(storage.events, "nap-race") == rival_tokens[0]
            assert_gapless(log)
            assert await check_replay(loom_node.app) == ["nap-race"]
            assert rival.reported == []

    @pytest.mark.parametrize(
        "withheld", [(), WITHOUT_CONDITIONAL],
        ids=["as-offered", "without-acquire_fence_if"],
    )
    @requires.acquire_fence
    async def test_two_resumers_of_one_app_answer_once_and_fence_no_one_out(
        self, loom_node: RuntimeNode, withheld: tuple[OptionalMethod, ...]
    ) -> None:
        """Two resumers of one app read the park open before either answered (a send's
        delivery and the timer service, say). They take turns: the first answers and its
        body runs; the second finds the park answered and is refused without a token, so
        the first's body is never fenced out mid-step, with or without the conditional
        acquire."""
        storage = loom_node.storage
        wrapped, seen = interposed(storage, withhold=withheld)
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app
            in_step, finish = asyncio.Event(), asyncio.Event()
            shipped: list[str] = []

            async def ship() -> str:
                shipped.append("ship")
                in_step.set()
                await finish.wait()
                return "shipped"

            @app.workflow(name="late")
            async def late(ctx: Context) -> str:
                await ctx.sleep(30)
                return await ctx.step(ship, name="ship")

            handle = await app.start(late, id="two-resumers")
            await node.settled()
            park = await node.park_of("two-resumers")
            second_read = asyncio.Event()
            second: list[asyncio.Future[None]] = []

            async def the_second_reads_first(_: str) -> None:
                seen.before_acquire_if = seen.before_acquire_fence = None
                seen.after_read = lambda _: second_read.set()
                second.append(
                    asyncio.ensure_future(app.resume("two-resumers", fence_if_parked_at=park))
                )
                await guard(second_read.wait())  # its view: the park open, as the first's
                seen.after_read = None

            seen.before_acquire_if = seen.before_acquire_fence = the_second_reads_first
            await app.resume("two-resumers", fence_if_parked_at=park)
            await guard(in_step.wait())
            with pytest.raises(ResumeRefusedError) as refused:
                await guard(second[0])
            assert refused.value.reason == "not-suspended"
            held = await token_of(storage.events, "two-resumers")
            finish.set()
            assert await result(handle) == "shipped"
            assert shipped == ["ship"]
            log = await node.log("two-resumers")
            assert [e.kind for e in log] == [
                EventKind.EXECUTION_STARTED,
                EventKind.EXECUTION_SUSPENDED,
                EventKind.EXECUTION_RESUMED,
                EventKind.STEP_COMPLETED,
                EventKind.EXECUTION_COMPLETED,
            ]
            assert all(e.fence == held for e in log[2:]), "the second resumer took a token"
            assert_gapless(log)
            assert await check_replay(app) == ["two-resumers"]
            assert node.reported == []

    @pytest.mark.parametrize(
        "withheld", [(), WITHOUT_CONDITIONAL],
        ids=["as-offered", "without-acquire_fence_if"],
    )
    @requires.acquire_fence
    async def test_a_dead_acquirer_does_not_keep_the_park_from_being_resumed(
        self, loom_node: RuntimeNode, withheld: tuple[OptionalMethod, ...]
    ) -> None:
        """Someone took the fence of a parked execution and died before answering: the
        park is still open, so a resume takes the fence past them and answers it."""
        storage = loom_node.storage
        wrapped, seen = interposed(storage, withhold=withheld)
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app
            handle, park = await node.start_nap("nap-dead")
            dead = await storage.events.acquire_fence("nap-dead")  # ... and never appends
            await app.resume("nap-dead", fence_if_parked_at=park)
            assert await result(handle) == "awake"
            log = await node.log("nap-dead")
            (answer,) = answers(log)
            assert answer.sequence == park + 1
            assert answer.fence > dead
            assert_gapless(log)
            assert await check_replay(app) == ["nap-dead"]
            assert node.reported == []
        assert not any(seen.calls.get(m) for m in withheld), seen.calls

    @requires.acquire_fence
    @requires.acquire_fence_if
    async def test_three_dead_acquirers_end_in_contention_with_the_log_untouched(
        self, loom_node: RuntimeNode
    ) -> None:
        """Before each of the resume's conditional acquires a rival takes the fence and
        dies: every attempt is stale with the park still open. After the last one the
        resume gives up with ResumeContendedError, having written nothing; once the
        rivals are gone a retry succeeds."""
        storage = loom_node.storage
        dead: list[int] = []

        async def a_rival_takes_the_fence_and_dies(execution_id: str) -> None:
            dead.append(await storage.events.acquire_fence(execution_id))

        wrapped, contended = interposed(
            storage, before_acquire_if=a_rival_takes_the_fence_and_dies
        )
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app
            handle, park = await node.start_nap("nap-contended")
            parked_under = await token_of(storage.events, "nap-contended")
            before = await snapshot(storage.events)

            with pytest.raises(ResumeContendedError) as contention:
                await app.resume("nap-contended", fence_if_parked_at=park)
            assert contention.value.attempts == 3
            assert contention.value.retryable is True
            assert contention.value.execution_id == "nap-contended"
            assert await snapshot(storage.events) == before
            assert dead == [parked_under + 1, parked_under + 2, parked_under + 3]
            assert await token_of(storage.events, "nap-contended") == dead[-1]
            assert await handle.status() == "suspended"

            contended.before_acquire_if = None
            await app.resume("nap-contended", fence_if_parked_at=park)
            assert await result(handle) == "awake"
            (answer,) = answers(await node.log("nap-contended"))
            assert answer.fence == dead[-1] + 1
            assert await check_replay(app) == ["nap-contended"]
            assert node.reported == []

    @requires.acquire_fence
    @requires.acquire_fence_if
    async def test_a_contended_timer_backs_off_and_fires_once_the_rivals_are_gone(
        self, loom_node: RuntimeNode
    ) -> None:
        storage = loom_node.storage

        async def a_rival_takes_the_fence_and_dies(execution_id: str) -> None:
            await storage.events.acquire_fence(execution_id)

        wrapped, contended = interposed(
            storage, before_acquire_if=a_rival_takes_the_fence_and_dies
        )
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app = node.app
            wake_at = node.clock.now() + timedelta(seconds=30)
            handle, _ = await node.start_nap("nap-backoff")
            before = await snapshot(storage.events)
            row = TimerRecord("nap-backoff", wake_at)
            assert await node.fire_timers(30) == {row: "backing-off"}
            assert await snapshot(storage.events) == before
            assert await storage.timers.pending("nap-backoff") == (row,)

            contended.before_acquire_if = None
            assert await node.fire_timers(60) == {row: "resumed"}
            assert await result(handle) == "awake"
            assert await storage.timers.pending("nap-backoff") == ()
            assert len(answers(await node.log("nap-backoff"))) == 1
            assert await check_replay(app) == ["nap-backoff"]
            assert node.reported == []

    # -- replay divergence --------------------------------------------------------------

    @pytest.mark.parametrize("change", CHANGES)
    async def test_a_changed_body_fails_the_replay_check_and_appends_nothing(
        self, loom_node: RuntimeNode, change: Change
    ) -> None:
        """A second app on the same store registers a changed body under the workflow's
        name (a step renamed, two reordered, one removed)."""
        storage, counter = loom_node.storage, _Counter()

        @loom_node.app.workflow(name="order")
        async def order(ctx: Context) -> list[str]:
            return [await ctx.step(counter.step(n), name=n) for n in ("reserve", "charge", "ship")]

        assert await result(await loom_node.app.start(order, id="order-1")) == [
            "reserve", "charge", "ship",
        ]
        before = await snapshot(storage.events)
        async with running_app(storage, node=RIVAL_NODE) as deployed:

            @deployed.app.workflow(name="order")
            async def changed(ctx: Context) -> list[str]:
                return [await ctx.step(counter.step(n), name=n) for n in changed_steps(change)]

            with pytest.raises(ReplayDivergedError) as diverged:
                await check_replay(deployed.app)
            assert diverged.value.execution_id == "order-1"
            assert diverged.value.position == DIVERGES_AT[change]
            assert await snapshot(storage.events) == before
            assert counter.ran == {"reserve": 1, "charge": 1, "ship": 1}
            assert deployed.reported == []

    @pytest.mark.parametrize("change", CHANGES)
    async def test_a_changed_body_refuses_the_resume_of_its_park_and_appends_nothing(
        self, loom_node: RuntimeNode, change: Change
    ) -> None:
        """The live case: the resume replays the log against the changed code before it
        answers the park, and refuses; the execution stays parked, its log untouched."""
        storage, counter = loom_node.storage, _Counter()

        @loom_node.app.workflow(name="order")
        async def order(ctx: Context) -> str:
            await ctx.step(counter.step("reserve"), name="reserve")
            await ctx.step(counter.step("charge"), name="charge")
            await ctx.sleep(60)
            return await ctx.step(counter.step("ship"), name="ship")

        await loom_node.app.start(order, id="order-2")
        await loom_node.settled()
        park = await loom_node.park_of("order-2")
        parked = await loom_node.log("order-2")
        async with running_app(storage, node=RIVAL_NODE) as deployed:
            steps = changed_steps(change)

            @deployed.app.workflow(name="order")
            async def changed(ctx: Context) -> str:
                for name in steps[:-1]:
                    await ctx.step(counter.step(name), name=name)
                await ctx.sleep(60)
                return await ctx.step(counter.step(steps[-1]), name=steps[-1])

            with pytest.raises(ReplayDivergedError) as diverged:
                await deployed.app.resume("order-2", fence_if_parked_at=park)
            await deployed.settled()
            assert diverged.value.position == DIVERGES_AT[change]
            assert deployed.reported == []  # the resume's caller was told
            assert (await deployed.app.inspect("order-2")).status == "suspended"
        assert await loom_node.log("order-2") == parked
        assert counter.ran == {"reserve": 1, "charge": 1}

    # -- cancellation -------------------------------------------------------------------

    async def test_cancelling_a_parked_execution_answers_its_park_and_retires_its_timers(
        self, loom_node: RuntimeNode
    ) -> None:
        app, timers = loom_node.app, loom_node.storage.timers
        handle, _ = await loom_node.start_nap("nap-cancel")
        assert await app.cancel("nap-cancel", reason="customer left") is True
        with pytest.raises(ExecutionCancelledError) as cancelled:
            await result(handle)
        assert cancelled.value.reason == "customer left"
        assert await timers.pending("nap-cancel") == ()
        assert await loom_node.kinds("nap-cancel") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_CANCELLED,
        ]
        finished = await snapshot(loom_node.events)
        assert await app.cancel("nap-cancel") is False
        assert await loom_node.fire_timers(30) == {}
        assert await snapshot(loom_node.events) == finished
        assert await check_replay(app) == ["nap-cancel"]

    async def test_an_execution_past_its_deadline_is_cancelled_as_timed_out(
        self, loom_node: RuntimeNode
    ) -> None:
        """``execution_timeout=`` is kept in EXECUTION_STARTED and as a timer row (with a
        sleep's row of the same execution beside it): firing it cancels the parked
        execution, marks it timed out, and retires every row; one that ended in time
        keeps its result and leaves no row."""
        app, timers = loom_node.app, loom_node.storage.timers

        @app.workflow(name="kit.deadline")
        async def waits(ctx: Context, seconds: float) -> str:
            await ctx.sleep(seconds)
            return "in time"

        handle = await app.start(waits, 100, id="kit-deadline-late", execution_timeout=60)
        quick = await app.start(waits, 10, id="kit-deadline-quick", execution_timeout=60)
        await loom_node.settled()
        assert len(await timers.pending("kit-deadline-late")) == 2  # the sleep and deadline
        assert (await app.inspect("kit-deadline-late")).deadline is not None
        await loom_node.fire_timers(10)
        assert await result(quick) == "in time"
        assert await timers.pending("kit-deadline-quick") == ()
        fired = await loom_node.fire_timers(50)
        assert list(fired.values()) == ["timed-out"]
        with pytest.raises(ExecutionTimedOutError) as timed_out:
            await result(handle)
        assert isinstance(timed_out.value, ExecutionCancelledError)
        assert (await app.inspect("kit-deadline-late")).timed_out
        assert await timers.pending("kit-deadline-late") == ()
        assert await loom_node.kinds("kit-deadline-late") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_CANCELLED,
        ]
        assert await check_replay(app) == ["kit-deadline-late", "kit-deadline-quick"]

    async def test_a_fork_is_written_whole_and_served_its_copied_calls(
        self, loom_node: RuntimeNode
    ) -> None:
        """``app.fork`` writes EXECUTION_STARTED and every copied record in one append: a
        fork of a parked execution at its sleep is served the steps and the message before
        it from what the store gives back, parks on a sleep of its own, and leaves the
        original exactly as it was."""
        app = loom_node.app
        ran: list[str] = []

        def work(label: str) -> str:
            ran.append(label)
            return label.upper()

        @app.workflow(name="kit.fork")
        async def forked(ctx: Context, order: str) -> list[object]:
            first = await ctx.step(work, order)
            note = await ctx.receive("note")
            await ctx.sleep(30)
            return [first, note, await ctx.step(work, "after")]

        original = await app.start(forked, "o-1", id="kit-fork-original")
        await app.send("kit-fork-original", "note", {"text": "é ✓"})
        await loom_node.settled()
        before = await loom_node.log("kit-fork-original")
        fork = await app.fork("kit-fork-original", at=2, id="kit-fork-copy")
        await loom_node.settled()
        assert await loom_node.log("kit-fork-original") == before
        assert await loom_node.kinds("kit-fork-copy") == [
            EventKind.EXECUTION_STARTED,
            EventKind.STEP_COMPLETED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_SUSPENDED,
        ]
        assert ran == ["o-1"]  # served, not run again
        view = await app.inspect("kit-fork-copy")
        assert (view.forked_from, view.forked_at, view.status) == (
            "kit-fork-original", 2, "suspended"
        )
        await loom_node.fire_timers(30)
        expected = ["O-1", {"text": "é ✓"}, "AFTER"]
        assert await result(fork) == expected
        assert await result(original) == expected
        assert ran == ["o-1", "after", "after"]
        assert await check_replay(app, ["kit-fork-copy"]) == ["kit-fork-copy"]

    async def test_cancelling_a_running_execution_fences_its_driver_out(
        self, loom_node: RuntimeNode
    ) -> None:
        app = loom_node.app
        started, release = asyncio.Event(), asyncio.Event()
        charged: list[int] = []

        async def charge() -> str:
            started.set()
            await release.wait()
            charged.append(1)
            return "charged"

        @app.workflow(name="slow-charge")
        async def slow_charge(ctx: Context) -> str:
            await ctx.step(charge, name="charge")
            return await ctx.step(charge, name="charge-again")

        handle = await app.start(slow_charge, id="charge-1")
        await guard(started.wait())
        assert await app.cancel("charge-1", reason="fraud") is True
        release.set()
        await loom_node.settled()
        with pytest.raises(ExecutionCancelledError):
            await result(handle)
        assert charged == [1]  # the step ran, but its driver could not record it
        log = await loom_node.log("charge-1")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_CANCELLED,
        ]
        assert_gapless(log)
        assert await check_replay(app) == ["charge-1"]

    # -- continue-as-new ----------------------------------------------------------------

    async def test_continue_as_new_chains_executions_and_the_handle_follows(
        self, loom_node: RuntimeNode
    ) -> None:
        app, counter = loom_node.app, _Counter()

        @app.workflow(name="countdown")
        async def countdown(ctx: Context, n: int) -> int:
            await ctx.step(counter.step(f"round-{n}", n), name=f"round-{n}")
            if n > 0:
                ctx.continue_as_new(n - 1)
            return 100

        handle = await app.start(countdown, 3, id="count")
        assert await result(handle) == 100
        chain = ["count", "count#1", "count#2", "count#3"]
        assert await loom_node.events.list_executions() == tuple(chain)
        for execution_id, successor in itertools.pairwise(chain):
            log = await loom_node.log(execution_id)
            assert log[-1].kind == EventKind.EXECUTION_CONTINUED
            assert field_of(log[-1], "successor") == successor
            first = (await loom_node.log(successor))[0]
            assert first.kind == EventKind.EXECUTION_STARTED
            assert field_of(first, "continued_from") == execution_id
        assert (await loom_node.log("count#3"))[-1].kind == EventKind.EXECUTION_COMPLETED
        assert counter.ran == {f"round-{n}": 1 for n in range(4)}
        assert await check_replay(app) == chain

    # -- the runtime's fallbacks --------------------------------------------------------

    @pytest.mark.parametrize(
        "withheld", [WITHOUT_CONDITIONAL, WITHOUT_FENCING],
        ids=["without-acquire_fence_if", "without-either-acquire"],
    )
    async def test_the_runtime_runs_on_a_store_without_the_conditional_acquire(
        self, loom_node: RuntimeNode, withheld: tuple[OptionalMethod, ...]
    ) -> None:
        """The store under test with the acquire methods withheld: the runtime takes its
        fallbacks (the unconditional acquire, or the park's own token) for resume, timers,
        messages, recovery and cancellation, and never calls what is not offered."""
        wrapped, seen = interposed(loom_node.storage, withhold=withheld)
        assert not set(withheld) & wrapped.events.capabilities
        async with running_app(wrapped, clock=loom_node.clock) as node:
            app, counter = node.app, _Counter()

            @app.workflow(name="lifecycle")
            async def lifecycle(ctx: Context) -> list[Any]:
                reserved = await ctx.step(counter.step("reserve"), name="reserve")
                note = await ctx.receive("note")
                await ctx.sleep(30)
                await ctx.sleep(30)
                shipped = await ctx.step(counter.step("ship"), name="ship")
                return [reserved, note, shipped]

            crash = crash_at(app, step="reserve", when="after", execution_id="life-1")
            handle = await app.start(lifecycle, id="life-1")
            await guard(crash.fired.wait())
            await node.settled()
            assert [h.execution_id for h in await app.recover()] == ["life-1"]
            await node.settled()
            await app.send("life-1", "note", "hello")  # answers the receive
            await node.settled()
            await node.fire_timers(30)  # answers the first sleep through the timer
            await app.resume("life-1", fence_if_parked_at=await node.park_of("life-1"))
            assert await result(handle) == ["reserve", "hello", "ship"]
            assert counter.ran == {"reserve": 1, "ship": 1}
            assert_gapless(await node.log("life-1"))

            cancelled, _ = await node.start_nap("nap-gone")
            assert await app.cancel("nap-gone") is True
            with pytest.raises(ExecutionCancelledError):
                await result(cancelled)
            assert await check_replay(app) == ["life-1", "nap-gone"]
            assert node.reported == []
        assert not any(seen.calls.get(m) for m in withheld), seen.calls

    # -- drawn workflows ----------------------------------------------------------------

    @drawn_settings(DRAWN_EXAMPLES)
    @given(plan=plans())
    @with_chosen_plans
    async def test_drawn_workflows_killed_at_drawn_points_finish_exactly_once(
        self, loom_storage: Storage, plan: Plan
    ) -> None:
        """Workflows drawn by Hypothesis (steps, failing steps, sleeps, receives, gathers,
        recorded values, continue-as-new) killed at drawn points and recovered, on one node
        or two: each step runs once, each message is consumed once, no timer fires early,
        each log is gapless and replays (:mod:`loom_conformance.drawn_workflows`). Every
        example is a new execution on the same store."""
        execution_id = f"drawn-{next(_DRAWN_IDS)}"
        async with drawn_app(loom_storage, node=NODE, services=False) as drawn:
            await check_plan(drawn, plan, execution_id)
