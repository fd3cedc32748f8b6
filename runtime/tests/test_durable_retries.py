"""A step's failed attempts are in the log: a run that dies while it waits to try again
goes on from the next attempt, at the instant the retry was due, wherever it is
recovered; the policy's attempts bound the step across process deaths."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from loom_runtime import (
    Context,
    Loom,
    ReplayDivergedError,
    Retry,
    RunStoppedError,
    StepFailedError,
    WorkflowFailedError,
    step_info,
)
from loom_runtime.records import ATTEMPT_FAILED_KIND
from loom_runtime.testing import VirtualClock, check_replay

from loom_core import EventKind, Storage, open_storage

START = datetime(2030, 1, 1, tzinfo=UTC)  # where a VirtualClock starts


@pytest.fixture
async def storage() -> AsyncIterator[Storage]:
    async with open_storage("memory://") as opened:
        yield opened


class Flaky:
    """A step that fails its first ``failures`` calls, counting every call."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, order: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"gateway down (call {self.calls})")
        return f"charged {order}"


Body = Callable[..., Awaitable[object]]


def node(storage: Storage, clock: VirtualClock, body: Body) -> Loom:
    """An app of node "n" on ``storage``, with the workflow ``checkout`` registered."""
    app = Loom(storage, node="n", clock=clock)
    app.workflow(name="checkout")(body)
    return app


def checkout_with(step: Flaky, retry: Retry) -> Body:
    async def checkout(ctx: Context, order: str) -> object:
        return await ctx.step(step, order, name="charge", retry=retry)

    return checkout


async def left_retrying(
    storage: Storage, clock: VirtualClock, charge: Flaky, retry: Retry, order: str, wait: float
) -> None:
    """Start ``order``'s checkout on node "n", let ``wait`` seconds pass, and leave the
    app (a process that dies) while the step waits to be tried again."""
    first = node(storage, clock, checkout_with(charge, retry))
    async with first:
        await first.start("checkout", order, id=order)
        await clock.advance(wait)


async def attempts_of(storage: Storage, execution_id: str) -> list[tuple[object, object]]:
    return [
        (e.payload["attempt"], e.payload["retry_at"])  # type: ignore[call-overload,index]
        for e in await storage.events.read(execution_id)
        if e.kind == ATTEMPT_FAILED_KIND
    ]


async def test_each_failed_attempt_is_recorded_with_when_it_is_tried_again(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    charge = Flaky(failures=2)
    app = node(storage, clock, checkout_with(charge, Retry(attempts=3, initial_interval=10)))
    async with app:
        handle = await app.start("checkout", "o-1", id="o-1")
        await clock.advance(0)
        assert charge.calls == 1
        view = await app.inspect("o-1")
        (retrying,) = view.retries.values()
        assert (retrying.name, retrying.attempt) == ("charge", 1)
        assert retrying.error == ("ConnectionError", "gateway down (call 1)")
        assert retrying.retry_at == START + timedelta(seconds=10)
        await clock.advance(10)
        assert charge.calls == 2
        await clock.advance(20)  # the second interval: 10 * 2
        assert await handle.result(timeout=5) == "charged o-1"
        assert charge.calls == 3
        assert await attempts_of(storage, "o-1") == [
            (1, (START + timedelta(seconds=10)).isoformat()),
            (2, (START + timedelta(seconds=30)).isoformat()),
        ]
        view = await app.inspect("o-1")
        assert view.retries == {}  # the step completed
        assert view.records[(0,)].attempt == 3
        assert await check_replay(app, ["o-1"]) == ["o-1"]


async def test_a_run_stopped_while_it_waits_goes_on_from_the_next_attempt_when_it_was_due(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    charge = Flaky(failures=1)
    checkout = checkout_with(charge, Retry(attempts=3, initial_interval=60))
    first = node(storage, clock, checkout)
    async with first:
        await first.start("checkout", "o-2", id="o-2")
        await clock.advance(30)  # halfway through the interval
        assert charge.calls == 1
    # The process is gone; its node starts again and recovers the execution.
    again = node(storage, clock, checkout)
    async with again:
        await clock.advance(0)
        assert charge.calls == 1  # not before the instant the log names
        await clock.advance(29)
        assert charge.calls == 1
        await clock.advance(1)
        assert await again.get("o-2").result(timeout=5) == "charged o-2"
        assert charge.calls == 2
        assert (await again.inspect("o-2")).records[(0,)].attempt == 2


async def test_the_attempts_bound_the_step_across_process_deaths(storage: Storage) -> None:
    """Each process dies while the step waits to be tried again: three attempts in all,
    then the step fails for good (before, every restart began again from attempt 1)."""
    clock = VirtualClock()
    charge = Flaky(failures=10)
    checkout = checkout_with(charge, Retry(attempts=3, initial_interval=5))
    for calls in (1, 2):
        app = node(storage, clock, checkout)
        async with app:
            if calls == 1:
                await app.start("checkout", "o-3", id="o-3")
            await clock.advance(1 if calls == 1 else 5)
            assert charge.calls == calls
    last = node(storage, clock, checkout)
    async with last:
        await clock.advance(10)
        with pytest.raises(WorkflowFailedError) as failed:
            await last.get("o-3").result(timeout=5)
        assert failed.value.error_type.endswith("StepFailedError")
        assert charge.calls == 3
        view = await last.inspect("o-3")
        assert view.records[(0,)].attempt == 3
        assert view.records[(0,)].error == ("ConnectionError", "gateway down (call 3)")


async def test_a_policy_that_now_allows_fewer_attempts_fails_the_step_without_running_it(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    charge = Flaky(failures=10)
    await left_retrying(storage, clock, charge, Retry(attempts=5, initial_interval=5), "o-4", 5)
    assert charge.calls == 2
    caught: list[str] = []

    async def careful(ctx: Context, order: str) -> object:
        try:
            return await ctx.step(
                charge, order, name="charge", retry=Retry(attempts=2, initial_interval=5)
            )
        except StepFailedError as exc:
            caught.append(f"{exc.attempts}: {exc.error_message}")
            return "gave up"

    again = node(storage, clock, careful)
    async with again:
        assert await again.get("o-4").result(timeout=5) == "gave up"
    assert charge.calls == 2
    assert caught == ["2: gateway down (call 2)"]


async def test_a_step_renamed_while_it_is_retried_diverges_and_writes_nothing(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    charge = Flaky(failures=10)
    await left_retrying(storage, clock, charge, Retry(attempts=3, initial_interval=5), "o-5", 1)

    async def renamed(ctx: Context, order: str) -> object:
        return await ctx.step(charge, order, name="pay", retry=Retry(attempts=3))

    errors: list[BaseException] = []
    again = Loom(storage, node="n", clock=clock, on_error=errors.append)
    again.workflow(name="checkout")(renamed)
    async with again:
        head = await storage.events.head("o-5")
        await again.drain()
        (diverged,) = [e for e in errors if isinstance(e, ReplayDivergedError)]
        assert "attempt 1 failed" in str(diverged)
        assert "'pay'" in str(diverged)
        # The takeover's EXECUTION_RECOVERED, and nothing after it.
        assert await storage.events.head("o-5") == head + 1
    assert charge.calls == 1


async def test_a_patch_before_a_step_being_retried_takes_the_old_path(
    storage: Storage,
) -> None:
    clock = VirtualClock()
    charge = Flaky(failures=1)
    await left_retrying(storage, clock, charge, Retry(attempts=3, initial_interval=5), "o-6", 1)
    notes: list[str] = []

    def notify(order: str) -> None:
        notes.append(order)

    async def patched(ctx: Context, order: str) -> object:
        if ctx.patched("notify-first"):
            await ctx.step(notify, order)
        return await ctx.step(charge, order, name="charge", retry=Retry(attempts=3))

    again = node(storage, clock, patched)
    async with again:
        await clock.advance(5)
        assert await again.get("o-6").result(timeout=5) == "charged o-6"
    assert notes == []
    kinds = [e.kind for e in await storage.events.read("o-6")]
    assert kinds.count(EventKind.STEP_COMPLETED) == 1


async def test_a_step_removed_while_it_is_retried_diverges(storage: Storage) -> None:
    clock = VirtualClock()
    charge = Flaky(failures=10)
    await left_retrying(storage, clock, charge, Retry(attempts=3, initial_interval=30), "o-7", 1)

    async def without_it(ctx: Context, order: str) -> object:
        return "nothing to charge"

    errors: list[BaseException] = []
    again = Loom(storage, node="n", clock=clock, on_error=errors.append)
    again.workflow(name="checkout")(without_it)
    async with again:
        await again.drain()
        assert (await again.inspect("o-7")).status == "running"
    (diverged,) = [e for e in errors if isinstance(e, ReplayDivergedError)]
    assert "attempt 1 failed, to be tried again" in str(diverged)
    assert "the body returns" in str(diverged)


async def test_a_siblings_result_is_written_before_the_next_attempt(storage: Storage) -> None:
    """In a gather, a branch finishes while another waits to try its step again: its
    result is durable before that attempt runs, as before any step (and a virtual
    clock's advance is not left waiting for the run that settled meanwhile)."""
    clock = VirtualClock()
    charge = Flaky(failures=1)
    seen_at_second_attempt: list[list[str]] = []

    async def pay(order: str) -> str:
        if charge.calls == 1:  # the second attempt: what does the log hold by now?
            log = await storage.events.read(order)
            seen_at_second_attempt.append([str(e.kind) for e in log])
        return charge(order)

    def email(order: str) -> str:
        return "sent"

    async def both(ctx: Context, order: str) -> object:
        return await ctx.gather(
            ctx.step(pay, order, retry=Retry(attempts=2, initial_interval=60)),
            ctx.step(email, order),
        )

    app = node(storage, clock, both)
    async with app:
        handle = await app.start("checkout", "o-8", id="o-8")
        await clock.advance(60)
        assert await handle.result(timeout=5) == ["charged o-8", "sent"]
    assert seen_at_second_attempt == [
        [EventKind.EXECUTION_STARTED, ATTEMPT_FAILED_KIND, EventKind.STEP_COMPLETED]
    ]


async def test_an_advance_sees_a_run_settle_when_a_sibling_ends_during_a_retry_wait(
    storage: Storage,
) -> None:
    """The branch that settles the run is not the one waiting on the clock: the clock
    hears of it from the run (an advance waited for ever)."""
    clock = VirtualClock()
    charge = Flaky(failures=1)
    gate = asyncio.Event()

    async def pay(order: str) -> str:
        return charge(order)

    async def email(order: str) -> str:
        await gate.wait()
        return "sent"

    async def both(ctx: Context, order: str) -> object:
        return await ctx.gather(
            ctx.step(pay, order, retry=Retry(attempts=2, initial_interval=600, max_interval=600)),
            ctx.step(email, order),
        )

    app = node(storage, clock, both)
    async with app:
        handle = await app.start("checkout", "o-9", id="o-9")
        advancing = asyncio.ensure_future(clock.advance(60))
        # Pay waits out its interval on the clock, and the advance waits for the run,
        # whose email branch is still going: only then does email end.
        while not (clock._sleepers and clock._nudges):  # noqa: ASYNC110 (no event for it)
            await asyncio.sleep(0)
        gate.set()
        await asyncio.wait_for(advancing, 10)
        assert charge.calls == 1
        await asyncio.wait_for(clock.advance(540), 10)
        assert await handle.result(timeout=5) == ["charged o-9", "sent"]


# -- which failures are retried, on each embedded store ------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/loom.db"
    async with open_storage(url) as opened:
        yield opened


async def test_non_retryable_wins_over_retry_on_and_subclasses_count(store: Storage) -> None:
    """``retry_on=ConnectionError, non_retryable=ConnectionRefusedError``: a reset (a
    ConnectionError) is retried, a refusal (one too) is not, a KeyError (neither) is not;
    a replay raises the same StepFailedError, field for field."""
    raising: dict[str, list[Exception | None]] = {
        "reset": [ConnectionResetError("reset"), None],
        "refused": [ConnectionRefusedError("refused"), None],
        "missing": [KeyError("card"), None],
    }
    calls: dict[str, int] = {}

    def charge(which: str) -> str:
        calls[which] = calls.get(which, 0) + 1
        error = raising[which][calls[which] - 1]
        if error is not None:
            raise error
        return f"charged after {calls[which]}"

    policy = Retry(
        attempts=3, initial_interval=0, retry_on=ConnectionError,
        non_retryable=ConnectionRefusedError,
    )

    async def checkout(ctx: Context, which: str) -> object:
        try:
            return await ctx.step(charge, which, name="charge", retry=policy)
        except StepFailedError as exc:
            return [exc.step, exc.position, exc.attempts, exc.error_type, exc.error_message]

    app = node(store, VirtualClock(), checkout)
    async with app:
        for which in raising:
            await app.start("checkout", which, id=which)
        results = {which: await app.get(which).result(timeout=5) for which in raising}
        assert sorted(await check_replay(app)) == sorted(raising)
    assert results == {
        "reset": "charged after 2",
        "refused": ["charge", "0", 1, "ConnectionRefusedError", "refused"],
        "missing": ["charge", "0", 1, "KeyError", "'card'"],
    }
    assert calls == {"reset": 2, "refused": 1, "missing": 1}


@pytest.mark.parametrize("named", [False, True])
async def test_a_steps_own_cancelled_error_is_retried_only_when_retry_on_names_it(
    store: Storage, named: bool
) -> None:
    calls: list[int] = []

    async def charge(order: str) -> str:
        calls.append(1)
        if len(calls) == 1:
            cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            await cancelled  # the step's own CancelledError: no one cancelled the run
        return f"charged {order}"

    retry_on = (Exception, asyncio.CancelledError) if named else (Exception,)

    async def checkout(ctx: Context, order: str) -> object:
        try:
            return await ctx.step(
                charge, order, retry=Retry(attempts=2, initial_interval=0, retry_on=retry_on)
            )
        except StepFailedError as exc:
            return [exc.attempts, exc.error_type]

    app = node(store, VirtualClock(), checkout)
    async with app:
        await app.start("checkout", "o-1", id="o-1")
        result = await app.get("o-1").result(timeout=5)
        assert await check_replay(app) == ["o-1"]
    if named:
        assert (result, len(calls)) == ("charged o-1", 2)
    else:
        assert (result, len(calls)) == ([1, "asyncio.exceptions.CancelledError"], 1)


class Abort(BaseException):
    """No Exception: a step that raises it stops its run, as a crash would."""


async def test_a_base_exception_named_in_retry_on_is_never_retried(store: Storage) -> None:
    """Attempt 1 fails and is recorded; attempt 2 raises a BaseException that ``retry_on``
    names: the run stops with nothing more recorded, and the recovery makes attempt 2
    again, under its number."""
    seen: list[int] = []

    def charge(order: str) -> str:
        info = step_info()
        assert info is not None
        seen.append(info.attempt)
        if len(seen) == 1:
            raise ConnectionError("down")
        if len(seen) == 2:
            raise Abort
        return f"charged {order}"

    async def checkout(ctx: Context, order: str) -> object:
        return await ctx.step(
            charge, order, retry=Retry(attempts=3, initial_interval=0, retry_on=(Abort, Exception))
        )

    errors: list[BaseException] = []
    app = Loom(store, node="n", clock=VirtualClock(), on_error=errors.append)
    app.workflow(name="checkout")(checkout)
    async with app:
        handle = await app.start("checkout", "o-1", id="o-1")
        with pytest.raises(RunStoppedError) as stopped:
            await handle.result(timeout=5)
        assert isinstance(stopped.value.__cause__, Abort)
        assert seen == [1, 2]
        assert [e.kind for e in await store.events.read("o-1")] == [
            EventKind.EXECUTION_STARTED, ATTEMPT_FAILED_KIND,
        ]
        await app.recover()
        assert await handle.result(timeout=5) == "charged o-1"
    assert seen == [1, 2, 2]


async def test_a_non_retryable_added_under_a_retried_step_applies_from_its_next_failure(
    store: Storage,
) -> None:
    """The log names the recorded failure's type, which no class can be checked against:
    the next attempt is made, and its failure, of a class now non-retryable, ends the
    step though attempts are left."""
    clock = VirtualClock()
    charge = Flaky(failures=10)
    await left_retrying(store, clock, charge, Retry(attempts=5, initial_interval=5), "o-1", 1)
    assert charge.calls == 1

    async def stricter(ctx: Context, order: str) -> object:
        try:
            return await ctx.step(
                charge, order, name="charge",
                retry=Retry(attempts=5, initial_interval=5, non_retryable=ConnectionError),
            )
        except StepFailedError as exc:
            return [exc.attempts, exc.error_message]

    again = node(store, clock, stricter)
    async with again:
        await clock.advance(5)
        assert await again.get("o-1").result(timeout=5) == [2, "gateway down (call 2)"]
    assert charge.calls == 2


async def test_an_exception_group_is_matched_as_itself_not_by_what_it_holds(
    store: Storage,
) -> None:
    calls: list[int] = []

    async def call_gateway(order: str) -> None:
        raise ConnectionError(f"gateway down for {order}")

    async def charge(order: str) -> str:
        calls.append(1)
        async with asyncio.TaskGroup() as group:
            group.create_task(call_gateway(order))
        return "unreached"

    async def checkout(ctx: Context, order: str) -> object:
        try:
            return await ctx.step(
                charge, order, retry=Retry(attempts=3, initial_interval=0, retry_on=ConnectionError)
            )
        except StepFailedError as exc:
            return [exc.attempts, exc.error_type]

    app = node(store, VirtualClock(), checkout)
    async with app:
        await app.start("checkout", "o-1", id="o-1")
        assert await app.get("o-1").result(timeout=5) == [1, "ExceptionGroup"]
    assert calls == [1]


async def test_a_result_that_is_not_json_at_the_second_attempt_fails_the_step_there(
    store: Storage,
) -> None:
    """Not retried though attempts are left (the step ran: again would repeat its
    effects), recorded under the attempt that returned it, and replayed the same."""
    calls: list[int] = []

    def charge(order: str) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("gateway down")
        return {order}  # a set: no JSON

    caught: list[list[object]] = []

    async def checkout(ctx: Context, order: str) -> object:
        try:
            return await ctx.step(charge, order, retry=Retry(attempts=5, initial_interval=0))
        except StepFailedError as exc:
            caught.append([exc.attempts, exc.error_type, exc.error_message, exc.__cause__])
            return "gave up"

    app = node(store, VirtualClock(), checkout)
    async with app:
        await app.start("checkout", "o-1", id="o-1")
        assert await app.get("o-1").result(timeout=5) == "gave up"
        assert await check_replay(app) == ["o-1"]
        assert (await app.inspect("o-1")).records[(0,)].attempt == 2
    assert calls == [1, 1]
    live, replayed = caught
    assert live == replayed
    assert live[:2] == [2, "loom_runtime.errors.NotJsonError"]
    assert live[3] is None
