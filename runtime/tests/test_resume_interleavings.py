"""Two nodes resume one park, interleaved at every store call, with crashes.

Each schedule runs the real ``Loom.resume`` of two apps, nodes A and B, over one storage
whose event store is gated (:mod:`loom_conformance.explorer.interleaving`): a word over
{A, B} lets one store call through per letter, and an app still waiting for a call when
the word ends is crashed there. Each node's program is the runtime's, not a copy: read
the log, ``acquire_fence_if`` with the park's token, on stale re-read the park and retry
with the token the store returned, under the fence read the tail and append
EXECUTION_RESUMED, then drive the body, which appends EXECUTION_COMPLETED.

The park every schedule starts from is the runtime's own log (copied from one written by
the app: EXECUTION_STARTED, EXECUTION_SUSPENDED at 1 under token 0, and an unfenced
EXECUTION_DENIED the authorize hook wrote after it), and a dead acquirer took token 1
before either node started, so every resume goes through the retry.

What every schedule must show, whatever crashed where:

- at most one EXECUTION_RESUMED answers the park;
- once a node's resume has landed, no one takes the token from its body, and no append
  of its body is refused (its body is never fenced out);
- a node refused with ``not-suspended`` was refused because the park really is answered;
  a node that did not resume raised ResumeRefusedError or ResumeContendedError, nothing
  else, and appended nothing;
- a node whose resume returned drove the body to its end.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from loom_conformance.explorer import Interleaving, Played, every_interleaving
from loom_runtime import ActionDeniedError, Loom, ResumeContendedError, ResumeRefusedError
from loom_runtime.testing import VirtualClock
from store_probes import TokenOnlyEventStore, nap, token_of

from loom_core import (
    EventKind,
    EventStore,
    FenceAcquired,
    FenceStale,
    StaleFenceError,
    Storage,
    open_storage,
)
from loom_core.spi import OptionalMethod

PARK: Final = 1
TEMPLATE: Final = "template"
MAX_STEPS: Final = 11
"""Every schedule of up to 11 store calls: the shortest schedule that puts A's resume
between B's re-read and B's retried acquire, and B's re-read after it, is 11 calls long."""

WINDOW: Final = "AAAABBBAABB"
"""A: read, stale, re-read, acquire (token 2); B: read, stale (current 2), re-read (still
open); A: tail, EXECUTION_RESUMED lands; B: acquire with token 2 (stale: the park is
answered), re-read (answered: not-suspended)."""

WITHOUT_CONDITIONAL: Final[tuple[OptionalMethod, ...]] = (
    "acquire_fence", "copy_prefix", "delete_execution"
)


@dataclass(slots=True)
class Bench:
    """Two apps over one gated storage, and the parked template each schedule copies."""

    base: Storage
    interleaving: Interleaving
    nodes: dict[str, Loom]
    template_head: int
    played: int = 0

    async def play(self, word: str) -> tuple[Played, list[str]]:
        """Run ``word`` on a fresh copy of the parked template; return what it did and
        the rules it broke."""
        self.played += 1
        execution_id = f"explored-{self.played:05d}"
        events = self.base.events
        await events.copy_prefix(TEMPLATE, execution_id, through_sequence=self.template_head - 1)
        await _dead_acquirer(events, execution_id)

        def node(app: Loom) -> Callable[[], Awaitable[None]]:
            async def resume() -> None:
                await app.resume(execution_id, fence_if_parked_at=PARK)
                await app.drain()  # the body runs on, as this node's actor

            return resume

        played = await self.interleaving.play(
            word, {name: node(app) for name, app in self.nodes.items()}
        )
        broken = await judge(events, execution_id, played)
        await events.delete_execution(execution_id)
        await self.base.timers.cancel(execution_id)
        return played, broken


async def _dead_acquirer(events: EventStore, execution_id: str) -> None:
    """Takes token 1 and dies before answering."""
    if "acquire_fence_if" in events.capabilities:
        taken = await events.acquire_fence_if(execution_id, fence=0, park_seq=PARK)
        assert taken == FenceAcquired(1)
    else:
        assert await events.acquire_fence(execution_id) == 1


async def judge(events: EventStore, execution_id: str, played: Played) -> list[str]:
    """The rules of the module docstring that ``played`` broke."""
    log = await events.read(execution_id)
    token = await token_of(events, execution_id)
    broken: list[str] = []
    answers = [e for e in log if e.sequence > PARK and e.kind == EventKind.EXECUTION_RESUMED]
    if len(answers) > 1:
        broken.append(f"{len(answers)} EXECUTION_RESUMED answer the park")
    for name, outcome in sorted(played.outcomes.items()):
        calls = played.by(name)
        landed = next(
            (i for i, c in enumerate(calls)
             if any(e.kind == EventKind.EXECUTION_RESUMED for e in c.written())),
            None,
        )
        if landed is not None:
            held = calls[landed].written()[-1].fence
            if token != held:
                broken.append(
                    f"{name}'s resume landed under token {held}, then the token was taken "
                    f"({token} now): its body is fenced out from then on"
                )
            refused = [c for c in calls[landed + 1 :] if c.method == "append" and c.refused]
            if refused:
                broken.append(f"{name}'s running body was refused: {refused[0].describe()}")
            if outcome.kind == "returned" and log[-1].kind != EventKind.EXECUTION_COMPLETED:
                broken.append(f"{name} resumed and returned, but its body did not finish")
        elif any(c.written() for c in calls):
            broken.append(f"{name} wrote to the log without resuming it")
        elif outcome.kind == "returned":
            broken.append(f"{name}'s resume returned, but no resume of its landed")
        if outcome.kind == "raised":
            error = outcome.error
            if isinstance(error, ResumeRefusedError):
                if error.reason != "not-suspended" or not answers:
                    broken.append(f"{name} was refused ({error.reason}), but nobody answered")
            elif not isinstance(error, ResumeContendedError):
                broken.append(f"{name} raised {type(error).__name__}: {error}")
    return broken


@asynccontextmanager
async def bench(
    url: str = "memory://",
    *,
    offer: tuple[OptionalMethod, ...] | None = None,
    layer: Callable[[EventStore], EventStore] | None = None,
) -> AsyncIterator[Bench]:
    """Nodes A and B over ``url`` (its event store narrowed to ``offer``, with ``layer``
    between the gate and the store), and the template park, written by a third app."""
    base = await open_storage(url, options={} if offer is None else {"offer": offer})
    interleaving = Interleaving()
    events = base.events if layer is None else layer(base.events)
    gated = Storage(interleaving.gate(events), interleaving.track(base.timers), base.leases)
    clock = VirtualClock()
    errors: list[BaseException] = []

    def node(name: str, deny: bool = False) -> Loom:
        app = Loom(
            gated, node=name, clock=clock, random=random.Random(0), on_error=errors.append,
            authorize=(lambda *_: False) if deny else None, timers=False, recover=False,
        )
        app.workflow(name="nap")(nap)
        return app

    nodes = {"A": node("A"), "B": node("B")}
    writer = node("W", deny=True)
    try:
        async with AsyncExitStack() as stack:
            for app in (writer, *nodes.values()):
                await stack.enter_async_context(app)
            await writer.start("nap", id=TEMPLATE)
            await writer.drain()
            with pytest.raises(ActionDeniedError):
                await writer.resume(TEMPLATE, fence_if_parked_at=PARK, principal="mallory")
            template = await base.events.read(TEMPLATE)
            assert [e.kind for e in template] == [
                EventKind.EXECUTION_STARTED,
                EventKind.EXECUTION_SUSPENDED,
                EventKind.EXECUTION_DENIED,
            ]
            assert [e.fence for e in template] == [0, 0, 0]
            yield Bench(base, interleaving, nodes, len(template))
        assert errors == [], errors
    finally:
        await base.close()


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"


def _retried_with_the_returned_token(played: Played) -> bool:
    for name in played.outcomes:
        returned: set[int] = set()
        for call in played.by(name):
            if call.method != "acquire_fence_if":
                continue
            if call.arguments["fence"] in returned:
                return True
            if isinstance(call.result, FenceStale):
                returned.add(call.result.fence)
    return False


def _refused_by_the_park(played: Played) -> bool:
    """A conditional acquire whose token matched, refused because the park is answered."""
    return any(
        isinstance(c.result, FenceStale) and c.result.fence == c.arguments["fence"]
        for c in played.calls
    )


async def test_every_schedule_of_two_nodes_resuming_one_park_keeps_the_rules() -> None:
    async with bench() as b:
        words: set[str] = set()
        broken: list[str] = []
        landed = retried = refused_by_park = 0
        async for played in every_interleaving(
            lambda word: _played_and_judged(b, word, broken), max_steps=MAX_STEPS
        ):
            words.add(played.word)
            landed += any(
                e.kind == EventKind.EXECUTION_RESUMED for c in played.calls for e in c.written()
            )
            retried += _retried_with_the_returned_token(played)
            refused_by_park += _refused_by_the_park(played)
    assert broken == [], "\n\n".join(broken[:3])
    # Not vacuous: every crash point of both nodes up to 11 calls, resumes landed, the
    # retry on the returned token was taken, and the park condition refused a rival.
    assert WINDOW in words
    assert {"", "A", "B", "AB", "BA"} <= words
    assert landed > 0
    assert retried > 0
    assert refused_by_park > 0


async def test_every_schedule_of_up_to_seven_calls_keeps_the_rules_on_sqlite(
    tmp_path: Path,
) -> None:
    """The same rules over SQLite's conditional acquire, every schedule of up to seven
    store calls (each schedule costs a few file writes, so not up to eleven here)."""
    async with bench(f"sqlite:///{tmp_path / 'loom.db'}") as b:
        broken: list[str] = []
        played = [
            p.word async for p in every_interleaving(
                lambda word: _played_and_judged(b, word, broken), max_steps=7
            )
        ]
    assert broken == [], "\n\n".join(broken[:3])
    # Every word of up to 7 letters: within 7 calls no node finishes before the word ends.
    assert len(played) == len(set(played)) == 2**8 - 1


async def _played_and_judged(b: Bench, word: str, broken: list[str]) -> Played:
    played, rules = await b.play(word)
    broken.extend(f"{rule}\n{played.explain()}" for rule in rules)
    return played


async def test_a_resume_landing_between_a_rivals_re_read_and_its_retry_leaves_the_rival_stale_then_not_suspended(  # noqa: E501
    url: str,
) -> None:
    async with bench(url) as b:
        played, broken = await b.play(WINDOW + "A")  # and A's body finishes
    assert broken == [], played.explain()
    steps = [(c.actor, c.method) for c in played.calls]
    assert steps == [
        ("A", "read"), ("A", "acquire_fence_if"), ("A", "read"), ("A", "acquire_fence_if"),
        ("B", "read"), ("B", "acquire_fence_if"), ("B", "read"),
        ("A", "read"), ("A", "append"),
        ("B", "acquire_fence_if"), ("B", "read"),
        ("A", "append"),
    ], played.explain()
    a_calls, b_calls = played.by("A"), played.by("B")
    # A: stale on the park's token 0 (the dead acquirer holds 1), retried with 1, won 2.
    assert a_calls[1].result == FenceStale(1)
    assert a_calls[3].arguments == {"fence": 1, "park_seq": PARK}
    assert a_calls[3].result == FenceAcquired(2)
    # B: stale, re-read the park still open, then A's resume landed; B's retry presents
    # the token the store returned (2, which still matches) for the same park, and is
    # stale because the park is answered; its re-read sees that: not-suspended.
    assert b_calls[1].result == FenceStale(2)
    assert b_calls[2].result == ()
    assert b_calls[3].arguments == {"fence": 2, "park_seq": PARK}
    assert b_calls[3].result == FenceStale(2)
    tail = b_calls[4].result
    assert isinstance(tail, tuple)
    assert [e.kind for e in tail] == [EventKind.EXECUTION_RESUMED]
    b_outcome = played.outcomes["B"]
    assert isinstance(b_outcome.error, ResumeRefusedError)
    assert b_outcome.error.reason == "not-suspended"
    assert not any(c.written() for c in b_calls)
    # A was never fenced out: its body finished under its token, which nobody took.
    assert played.outcomes["A"].kind == "returned"
    assert not any(c.refused for c in a_calls)
    finished = a_calls[-1].written()
    assert [e.kind for e in finished] == [EventKind.EXECUTION_COMPLETED]
    assert finished[0].fence == 2
    assert [e.kind for e in a_calls[-2].written()] == [EventKind.EXECUTION_RESUMED]


async def test_negative_control_the_unconditional_acquire_fences_a_running_body_out() -> None:
    """The same schedules on a store without ``acquire_fence_if``: the runtime falls back
    to ``acquire_fence`` and a re-check, and a rival that read the park before the
    winner's resume landed takes a newer token after it; the winner's running body is
    refused by the store (the re-check then refuses the rival, too late). The exploration
    must find such a schedule."""
    async with bench(offer=WITHOUT_CONDITIONAL) as b:
        found: Played | None = None
        rules: list[str] = []
        async for played in every_interleaving(
            lambda word: _played_and_judged(b, word, rules), max_steps=MAX_STEPS
        ):
            if any("running body was refused" in rule for rule in rules):
                found = played
                break
    assert found is not None, "the control found no fenced-out body: it is not exercising"
    winner = next(
        n for n in sorted(found.outcomes)
        if any(e.kind == EventKind.EXECUTION_RESUMED for c in found.by(n) for e in c.written())
    )
    rival = "B" if winner == "A" else "A"
    landed_at = next(
        i for i, c in enumerate(found.calls)
        if c.actor == winner and c.method == "append" and c.written()
    )
    later = found.calls[landed_at + 1 :]
    taken_at = next(
        i for i, c in enumerate(later) if c.actor == rival and c.method == "acquire_fence"
    )
    refused = [c for c in later[taken_at:] if c.actor == winner and c.refused]
    assert refused, found.explain()
    assert isinstance(refused[0].error, StaleFenceError), found.explain()
    # Let the rival run on: its re-check under the fence refuses it, too late.
    async with bench(offer=WITHOUT_CONDITIONAL) as b:
        on, _ = await b.play(found.word + rival * 3)
    rival_outcome = on.outcomes[rival]
    assert isinstance(rival_outcome.error, ResumeRefusedError), on.explain()
    assert rival_outcome.error.reason == "not-suspended"
    # The conditional acquire keeps the same schedule clean.
    async with bench() as b:
        _, broken = await b.play(found.word)
    assert broken == []


async def test_negative_control_a_conditional_acquire_that_ignores_the_park_fences_the_winner_out(
) -> None:
    """A store whose conditional acquire compares only the token lets B's retry (token 2,
    which A's resume did not move) win after A's resume landed: B takes token 3, is then
    refused by its re-read, and A's body is refused by the store."""
    async with bench(layer=TokenOnlyEventStore) as b:
        played, broken = await b.play(WINDOW + "A")
    b_calls, a_calls = played.by("B"), played.by("A")
    assert b_calls[3].arguments == {"fence": 2, "park_seq": PARK}
    assert b_calls[3].result == FenceAcquired(3)
    assert isinstance(a_calls[-1].error, StaleFenceError)
    assert any("fenced out" in rule for rule in broken), broken
