"""A log deleted by one node (an operator pruning it) while another node writes to it, on
PostgreSQL: the resume, the cancel and the takeover that held a token for it stop at their
refused append, rather than appending again at the head they knew for ever, and none of
them makes the log anew.

An append at the head a writer read, to a log deleted since, is refused as a sequence
conflict whose actual head is below it; nothing is past that head to step over.
"""

from __future__ import annotations

import asyncio

import pytest
from loom_conformance.postgres import PostgresServer, loom_postgres_server
from loom_runtime import ActionDeniedError, Context, ExecutionNotFoundError, ResumeRefusedError
from loom_runtime.records import started
from store_probes import kinds, wired

from loom_core import EventKind, Storage, open_storage

__all__ = ["loom_postgres_server"]  # the session's server, a fixture


class Pruner:
    """Deletes the execution's log, through another node's storage, the first time a
    write of ``kind`` is about to reach the store; fails the test, rather than spinning,
    once that write is tried a fourth time."""

    def __init__(self, other: Storage, kind: str) -> None:
        self.other = other
        self.kind = kind
        self.tries = 0

    async def __call__(self, execution_id: str, kinds: tuple[str, ...]) -> None:
        if self.kind not in kinds:
            return
        self.tries += 1
        if self.tries == 1:
            await self.other.events.delete_execution(execution_id)
        assert self.tries <= 3, f"{self.kind} appended {self.tries} times to a deleted log"


async def test_a_resume_of_a_log_another_node_deletes_is_refused_once(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_deleted")
    async with wired(url, node="a") as a, open_storage(url) as b:
        await a.app.start("nap", id="x")
        await a.app.drain()
        park = (await a.app.inspect("x")).park
        assert park is not None
        pruner = Pruner(b, EventKind.EXECUTION_RESUMED)
        a.probe.before_append = pruner
        with pytest.raises(ResumeRefusedError) as refused:
            await a.app.resume("x", fence_if_parked_at=park.sequence)
        assert refused.value.reason == "not-suspended"
        assert "deleted" in str(refused.value)
        assert pruner.tries == 1
        assert await kinds(b.events, "x") == []


async def test_a_cancel_of_a_running_log_another_node_deletes_says_it_is_gone(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_deleted")
    entered, release = asyncio.Event(), asyncio.Event()

    async def held() -> str:
        entered.set()
        await release.wait()
        return "done"

    async def holds(ctx: Context) -> str:
        return await ctx.step(held, name="held")

    async with wired(url, node="a") as a, wired(url, node="b") as b:
        a.app.workflow(name="holds")(holds)
        b.app.workflow(name="holds")(holds)
        await a.app.start("holds", id="x")
        await entered.wait()
        pruner = Pruner(a.base, EventKind.EXECUTION_CANCELLED)
        b.probe.before_append = pruner
        with pytest.raises(ExecutionNotFoundError):
            await b.app.cancel("x", reason="no longer wanted")
        assert pruner.tries == 1
        release.set()
        await a.app.drain()  # a's run finds its log gone and stops
        assert await kinds(a.base.events, "x") == []


async def test_a_cancel_of_a_parked_log_another_node_deletes_says_it_is_gone(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_deleted")
    async with wired(url, node="a") as a, wired(url, node="b") as b:
        await a.app.start("nap", id="x")
        await a.app.drain()
        pruner = Pruner(a.base, EventKind.EXECUTION_CANCELLED)
        b.probe.before_append = pruner
        with pytest.raises(ExecutionNotFoundError):
            await b.app.cancel("x")
        assert pruner.tries == 1
        assert await kinds(a.base.events, "x") == []


async def test_a_recovery_whose_log_another_node_deletes_takes_nothing_over(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_deleted")
    async with wired(url, node="a") as a, open_storage(url) as b:
        # What a process of node a left when it died: a start, nothing driving it.
        first = started("nap", [], fingerprint="", node="a", root="x")
        await a.base.events.append("x", [first], expected_sequence=0, fence=0)
        pruner = Pruner(b, EventKind.EXECUTION_RECOVERED)
        a.probe.before_append = pruner
        assert await a.app.recover() == []
        assert pruner.tries == 1
        assert a.app.driving == frozenset()
        assert await kinds(b.events, "x") == []


async def test_a_denial_of_a_log_another_node_deletes_makes_no_log(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_deleted")

    def nobody(principal: object, action: str, execution_id: str) -> bool:
        return False

    async with wired(url, node="a") as a, wired(url, node="b", authorize=nobody) as b:
        await a.app.start("nap", id="x")
        await a.app.drain()
        pruner = Pruner(a.base, EventKind.EXECUTION_DENIED)
        b.probe.before_append = pruner
        with pytest.raises(ActionDeniedError):
            await b.app.cancel("x", principal="mallory")
        assert pruner.tries == 1  # the denial at the head it read, refused: no other
        assert await kinds(a.base.events, "x") == []


async def test_a_resume_of_a_log_another_node_deletes_before_its_token_is_refused(
    loom_postgres_server: PostgresServer,
) -> None:
    url = loom_postgres_server.fresh_database("loom_deleted")
    async with wired(url, node="a") as a, open_storage(url) as b:
        await a.app.start("nap", id="x")
        await a.app.drain()
        park = (await a.app.inspect("x")).park
        assert park is not None

        async def prune(execution_id: str) -> None:
            await b.events.delete_execution(execution_id)

        a.probe.before_acquire = prune
        with pytest.raises(ResumeRefusedError) as refused:
            await a.app.resume("x", fence_if_parked_at=park.sequence)
        assert refused.value.reason == "not-suspended"
        assert await kinds(b.events, "x") == []
