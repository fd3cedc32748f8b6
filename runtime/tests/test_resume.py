"""Resuming a park through the conditional fence (``app.resume(..., fence_if_parked_at=)``):
dead acquirers, contention, audit writes after the park, refusals that take no token, and
stores without the conditional acquire."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from loom_runtime import (
    ActionDeniedError,
    Context,
    Loom,
    ResumeContendedError,
    ResumeRefusedError,
)
from store_probes import StoreCall, Wired, kinds, token_of, wired

from loom_core import (
    EventKind,
    FenceAcquired,
    FenceStale,
    NewEvent,
)


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"


async def parked(w: Wired, execution_id: str = "n", workflow: str = "nap") -> int:
    """Start ``workflow`` and let it park; return the park's sequence."""
    await w.app.start(workflow, id=execution_id)
    await w.app.drain()
    view = await w.app.inspect(execution_id)
    assert view.status == "suspended"
    assert view.park is not None
    return view.park.sequence


def since(w: Wired, mark: int, method: str = "append") -> list[StoreCall]:
    """The runtime's calls of ``method`` after the first ``mark`` calls."""
    return [c for c in w.probe.calls[mark:] if c.method == method]


def conditional(w: Wired) -> list[tuple[int | None, int | None, object]]:
    """The runtime's conditional acquires: (presented token, park, outcome)."""
    return [(c.fence, c.park_seq, c.result) for c in w.probe.of("acquire_fence_if")]


async def test_a_dead_acquirer_is_stepped_over_by_retrying_with_the_token_the_store_returned(
    url: str,
) -> None:
    async with wired(url) as w:
        park = await parked(w)
        # Someone acquired for this park and died before answering it.
        assert await w.base.events.acquire_fence_if("n", fence=0, park_seq=park) == (
            FenceAcquired(1)
        )
        await w.app.resume("n", fence_if_parked_at=park)
        await w.app.drain()
        assert await w.app.get("n").result() == "awake"
        # Stale on the park's token, then the token the store returned, for the same park.
        assert conditional(w) == [(0, park, FenceStale(1)), (1, park, FenceAcquired(2))]
        assert w.probe.of("acquire_fence") == []
        log = await w.base.events.read("n")
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_RESUMED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert [e.fence for e in log] == [0, 0, 2, 2]
        assert isinstance(log[2].payload, dict)
        assert log[2].payload["park"] == park


async def test_three_dead_acquirers_make_the_resume_contended_not_refused_and_leave_the_log_alone(
    url: str,
) -> None:
    async with wired(url) as w:
        park = await parked(w)
        before = await w.base.events.read("n")

        async def dead_acquirer(execution_id: str) -> None:
            await w.base.events.acquire_fence(execution_id)  # and dies, answering nothing

        w.probe.before_acquire = dead_acquirer
        with pytest.raises(ResumeContendedError) as caught:
            await w.app.resume("n", fence_if_parked_at=park)
        error = caught.value
        assert not isinstance(error, ResumeRefusedError)
        assert error.retryable is True
        assert error.execution_id == "n"
        assert error.attempts == 3
        assert await w.base.events.read("n") == before
        # Each try presented the token the previous one returned; none won, and the three
        # tokens taken are the dead acquirers'.
        assert conditional(w) == [
            (0, park, FenceStale(1)), (1, park, FenceStale(2)), (2, park, FenceStale(3))
        ]
        assert await token_of(w.base.events, "n") == 3
        # Retryable: with the contention gone, the same call resumes it.
        w.probe.before_acquire = None
        await w.app.resume("n", fence_if_parked_at=park)
        await w.app.drain()
        assert await w.app.get("n").result() == "awake"


@pytest.mark.parametrize("window", ["before the resume reads", "between its read and acquire"])
async def test_an_unfenced_denial_and_an_application_event_after_the_park_are_stepped_over(
    url: str, window: str
) -> None:
    async with wired(url, authorize=lambda principal, action, _id: principal == "ops") as w:
        park = await parked(w)

        # The denial comes from another node over the same storage (one app answers one
        # execution's parks one at a time, so it cannot race itself).
        other = Loom(
            w.base, node="n2", authorize=lambda principal, action, _id: principal == "ops",
            timers=False, recover=False,
        )
        other.workflow(name="nap")(w.app.workflows["nap"])

        async def audit_writes() -> None:
            async with other:
                with pytest.raises(ActionDeniedError):
                    await other.resume("n", fence_if_parked_at=park, principal="mallory")
            head = await w.base.events.head("n")
            await w.base.events.append(
                "n", [NewEvent("order.note", {"text": "called the customer"})],
                expected_sequence=head,
            )

        if window == "before the resume reads":
            await audit_writes()
        else:
            async def once(_: str) -> None:
                w.probe.before_acquire = None
                await audit_writes()

            w.probe.before_acquire = once
        mark = len(w.probe.calls)
        await w.app.resume("n", fence_if_parked_at=park, principal="ops")
        await w.app.drain()
        assert await w.app.get("n").result() == "awake"
        log = await w.base.events.read("n")
        assert [e.sequence for e in log] == list(range(6))  # gapless, no sequence twice
        assert [e.kind for e in log] == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_DENIED,
            "order.note",
            EventKind.EXECUTION_RESUMED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert ["fence" in e.metadata for e in log[2:4]] == [False, False]
        assert [e.fence for e in log[4:]] == [1, 1]
        # One token taken (no burned one), the answer appended at the head the tail gave,
        # and the body ran on from the view past the tail: no write was refused.
        assert conditional(w) == [(0, park, FenceAcquired(1))]
        assert await token_of(w.base.events, "n") == 1
        fenced = [c for c in since(w, mark) if c.fence is not None]
        assert [(c.kinds, c.at, c.error) for c in fenced] == [
            ((EventKind.EXECUTION_RESUMED,), 4, None),
            ((EventKind.EXECUTION_COMPLETED,), 5, None),
        ]


async def test_a_resume_the_authorize_hook_denies_records_an_unfenced_denial_and_takes_no_token(
    url: str,
) -> None:
    async with wired(url, authorize=lambda principal, action, _id: principal == "ops") as w:
        park = await parked(w)
        with pytest.raises(ActionDeniedError) as caught:
            await w.app.resume("n", fence_if_parked_at=park, principal="mallory")
        assert (caught.value.execution_id, caught.value.action, caught.value.principal) == (
            "n", "resume", "mallory"
        )
        log = await w.base.events.read("n")
        assert log[-1].kind == EventKind.EXECUTION_DENIED
        assert log[-1].payload == {"action": "resume", "principal": "mallory"}
        assert "fence" not in log[-1].metadata
        assert w.probe.of("acquire_fence", "acquire_fence_if") == []
        assert await token_of(w.base.events, "n") == 0
        assert (await w.app.inspect("n")).status == "suspended"


async def test_an_authorize_hook_that_raises_refuses_the_call_with_its_error_and_writes_nothing(
    url: str,
) -> None:
    def unreachable(principal: object, action: str, execution_id: str) -> bool:
        raise ConnectionError("the policy service is down")

    async with wired(url, authorize=unreachable) as w:
        park = await parked(w)
        before = await w.base.events.read("n")
        with pytest.raises(ConnectionError, match="policy service"):
            await w.app.resume("n", fence_if_parked_at=park, principal="ops")
        with pytest.raises(ConnectionError, match="policy service"):
            await w.app.cancel("n", principal="ops")
        assert await w.base.events.read("n") == before
        assert w.probe.of("acquire_fence", "acquire_fence_if") == []
        assert (await w.app.inspect("n")).status == "suspended"


async def test_a_resume_of_an_answered_park_whose_body_runs_is_refused_and_takes_no_token(
    url: str,
) -> None:
    release = asyncio.Event()

    async def approval() -> str:
        await release.wait()
        return "approved"

    async def held(ctx: Context) -> str:
        await ctx.sleep(60)
        return await ctx.step(approval, name="approval")

    async with wired(url) as w:
        w.app.workflow(name="held")(held)
        park = await parked(w, workflow="held")
        await w.app.resume("n", fence_if_parked_at=park)
        assert (await w.app.inspect("n")).status == "running"
        assert "n" in w.app.driving
        before = await w.base.events.read("n")
        acquires = len(w.probe.of("acquire_fence", "acquire_fence_if"))
        with pytest.raises(ResumeRefusedError, match=r"it is running under node 'n1'") as caught:
            await w.app.resume("n", fence_if_parked_at=park)
        assert caught.value.reason == "not-suspended"
        assert await w.base.events.read("n") == before
        assert len(w.probe.of("acquire_fence", "acquire_fence_if")) == acquires
        assert await token_of(w.base.events, "n") == 1
        # The running body was not fenced out: it finishes under its own token.
        release.set()
        await w.app.drain()
        assert await w.app.get("n").result() == "approved"
        assert (await w.base.events.read("n"))[-1].fence == 1
        # Once it has finished, the park is still not there to answer.
        done = await w.base.events.read("n")
        with pytest.raises(ResumeRefusedError, match=r"\(it is completed\)") as caught:
            await w.app.resume("n", fence_if_parked_at=park)
        assert caught.value.reason == "not-suspended"
        assert await w.base.events.read("n") == done
        assert await token_of(w.base.events, "n") == 1


async def twice(ctx: Context) -> str:
    await ctx.sleep(60)
    await ctx.sleep(60)
    return "rested"


@pytest.mark.parametrize("sequence", ["the start", "the answered park", "past the head"])
async def test_a_resume_at_a_sequence_that_is_not_the_open_park_is_refused_and_takes_no_token(
    url: str, sequence: str
) -> None:
    async with wired(url) as w:
        w.app.workflow(name="twice")(twice)
        first = await parked(w, workflow="twice")
        await w.app.resume("n", fence_if_parked_at=first)
        await w.app.drain()
        view = await w.app.inspect("n")
        assert view.status == "suspended"
        assert view.park is not None
        assert view.park.sequence > first
        at = {"the start": 0, "the answered park": first, "past the head": view.head + 3}
        before = await w.base.events.read("n")
        acquires = len(w.probe.of("acquire_fence", "acquire_fence_if"))
        with pytest.raises(
            ResumeRefusedError, match=rf"its open park is at sequence {view.park.sequence},"
        ) as caught:
            await w.app.resume("n", fence_if_parked_at=at[sequence])
        assert caught.value.reason == "not-suspended"
        assert await w.base.events.read("n") == before
        assert len(w.probe.of("acquire_fence", "acquire_fence_if")) == acquires
        assert await token_of(w.base.events, "n") == 1


async def test_a_resume_of_an_execution_with_no_log_is_refused_and_writes_nothing() -> None:
    async with wired() as w:
        with pytest.raises(ResumeRefusedError) as caught:
            await w.app.resume("ghost", fence_if_parked_at=1)
        assert caught.value.reason == "not-suspended"
        assert await w.base.events.head("ghost") == 0
        assert w.probe.calls == []


async def test_without_the_conditional_acquire_a_resume_takes_acquire_fence_and_answers() -> None:
    async with wired(offer=("acquire_fence",)) as w:
        assert "acquire_fence_if" not in w.app.storage.events.capabilities
        park = await parked(w)
        assert await w.base.events.acquire_fence("n") == 1  # a dead acquirer: no matter here
        await w.app.resume("n", fence_if_parked_at=park)
        await w.app.drain()
        assert await w.app.get("n").result() == "awake"
        assert [c.result for c in w.probe.of("acquire_fence")] == [2]
        assert w.probe.of("acquire_fence_if") == []
        assert [e.fence for e in await w.base.events.read("n")] == [0, 0, 2, 2]


async def test_without_the_conditional_acquire_the_re_check_under_the_fence_refuses_a_park_answered_meanwhile(  # noqa: E501
) -> None:
    async with wired(offer=("acquire_fence",)) as w:
        park = await parked(w)
        rival = Loom(w.base, node="rival", clock=w.clock, timers=False, recover=False)
        rival.workflow(name="nap")(w.app.workflows["nap"])

        async def rival_answers_first(_: str) -> None:
            w.probe.before_acquire = None
            async with rival:
                await rival.resume("n", fence_if_parked_at=park)
                await rival.drain()

        w.probe.before_acquire = rival_answers_first
        mark = len(w.probe.calls)
        with pytest.raises(ResumeRefusedError) as caught:
            await w.app.resume("n", fence_if_parked_at=park)
        assert caught.value.reason == "not-suspended"
        log = await w.base.events.read("n")
        resumes = [e for e in log if e.kind == EventKind.EXECUTION_RESUMED]
        assert len(resumes) == 1
        assert isinstance(resumes[0].payload, dict)
        assert resumes[0].payload["node"] == "rival"
        assert since(w, mark) == []  # this app wrote nothing
        # The residual of the unconditional acquire: the token was taken all the same
        # (here after the rival's body had finished, so it fenced no one out).
        assert [c.result for c in w.probe.of("acquire_fence")] == [2]


async def test_without_the_conditional_acquire_a_second_resumer_of_one_app_fences_no_one_out(
) -> None:
    """Two resumers of one app read the park open before either answered: they take turns,
    and the second, looking at the log again before its unconditional acquire, finds the
    park answered and is refused without taking a token. Acquiring first would fence out
    the run the first one started, mid-step, and its step would run again."""
    async with wired(offer=("acquire_fence",)) as w:
        in_step, finish = asyncio.Event(), asyncio.Event()
        ran: list[str] = []

        async def ship() -> str:
            ran.append("ship")
            in_step.set()
            await finish.wait()
            return "shipped"

        @w.app.workflow(name="late")
        async def late(ctx: Context) -> str:
            await ctx.sleep(60)
            return await ctx.step(ship)

        park = await parked(w, "l", "late")
        second_read = asyncio.Event()
        second: list[asyncio.Task[None]] = []

        async def second_resumer_reads_first(_: str) -> None:
            w.probe.before_acquire = None
            w.probe.after_read = lambda execution_id: second_read.set()
            second.append(asyncio.create_task(w.app.resume("l", fence_if_parked_at=park)))
            await second_read.wait()  # its view: the park open, as it is for the first
            w.probe.after_read = None

        w.probe.before_acquire = second_resumer_reads_first
        await w.app.resume("l", fence_if_parked_at=park)
        await in_step.wait()
        with pytest.raises(ResumeRefusedError) as caught:
            await second[0]
        assert caught.value.reason == "not-suspended"
        assert [c.result for c in w.probe.of("acquire_fence")] == [1]
        finish.set()
        assert await w.app.get("l").result(timeout=5) == "shipped"
        assert ran == ["ship"]
        assert await kinds(w.base.events, "l") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_RESUMED,
            EventKind.STEP_COMPLETED,
            EventKind.EXECUTION_COMPLETED,
        ]
        assert w.errors == []


async def test_a_store_that_does_not_fence_resumes_under_the_token_of_the_park() -> None:
    async with wired(offer=()) as w:
        park = await parked(w)
        await w.app.resume("n", fence_if_parked_at=park)
        await w.app.drain()
        assert await w.app.get("n").result() == "awake"
        assert w.probe.of("acquire_fence", "acquire_fence_if") == []
        assert await kinds(w.base.events, "n") == [
            EventKind.EXECUTION_STARTED,
            EventKind.EXECUTION_SUSPENDED,
            EventKind.EXECUTION_RESUMED,
            EventKind.EXECUTION_COMPLETED,
        ]
