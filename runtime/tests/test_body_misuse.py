"""Bodies that use the ctx API, or asyncio, the way it was not meant: what they see live,
and that a replay of what they recorded sees the same (docs/runtime.md, "The workflow
body")."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from loom_runtime import Context, Loom, StepFailedError
from loom_runtime.testing import check_replay

from loom_core import EventKind


async def kinds(app: Loom, execution_id: str) -> list[str]:
    return [e.kind for e in await app.storage.events.read(execution_id)]


@pytest.fixture
async def unretrieved() -> AsyncIterator[list[dict[str, Any]]]:
    """What the running loop's exception handler is handed (a task freed with an
    exception nobody retrieved, asyncio logs as an error), collected for the test."""
    loop = asyncio.get_running_loop()
    handled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: handled.append(context))
    yield handled
    loop.set_exception_handler(previous)


async def fail(tag: str) -> None:
    raise ValueError(f"failed {tag}")


async def echo(value: object) -> object:
    return value


# -- ctx.gather ------------------------------------------------------------------------------


async def test_a_gather_that_ends_on_one_branch_takes_every_other_branchs_failure(
    app: Loom, unretrieved: list[dict[str, Any]]
) -> None:
    """A branch that continues as new, or a second failure behind the first in argument
    order, leaves no branch's exception unretrieved: asyncio logs nothing as an error
    when the gather's tasks are freed."""

    async def goes_on(ctx: Context, generation: int) -> None:
        await ctx.step(echo, generation)
        ctx.continue_as_new(generation + 1)

    @app.workflow()
    async def continues(ctx: Context, generation: int) -> object:
        if generation:
            return generation
        return await ctx.gather(goes_on(ctx, generation), ctx.step(fail, "behind"))

    @app.workflow()
    async def fails_twice(ctx: Context) -> object:
        try:
            await ctx.gather(ctx.step(fail, "first"), ctx.step(fail, "second"))
        except StepFailedError as exc:
            return exc.error_message
        return None

    assert await app.execute(continues, 0, id="c") == 1
    assert await app.execute(fails_twice, id="f") == "failed first"
    gc.collect()
    assert [context["message"] for context in unretrieved] == []
    assert await kinds(app, "c") == [
        EventKind.EXECUTION_STARTED,
        EventKind.STEP_COMPLETED,
        EventKind.STEP_FAILED,
        EventKind.EXECUTION_CONTINUED,
    ]
    assert sorted(await check_replay(app)) == ["c", "c#1", "f"]
    gc.collect()
    assert [context["message"] for context in unretrieved] == []
