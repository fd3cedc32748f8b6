"""The types a type checker gives code that uses the runtime, pinned.

The runtime env runs ``mypy --strict`` over this file: each ``assert_type`` fails the
check when an annotation loosens (to ``Any``, or to a JSON value where the function's own
return type belongs), and each call marked ``# type: ignore[code]`` must stay an error,
as strict mode reports an ignore that is no longer needed. The tests run the same code,
so what is asserted of a call's type is also what the call returns.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Literal, assert_type

import pytest
from loom_runtime import (
    Context,
    ExecutionCancelledError,
    Handle,
    Loom,
    Received,
    ResumeRefusedError,
    Retry,
    Status,
    StepFailedError,
    View,
    WorkflowFailedError,
)
from loom_runtime.testing import VirtualClock

from loom_core import JsonValue


async def charge(order_id: str, cents: int) -> str:
    return f"{order_id}:{cents}"


def reserve(sku: str) -> int:
    return len(sku)


def label(order_id: str, *, prefix: str = "L") -> str:
    return f"{prefix}-{order_id}"


def quote(*skus: str) -> float:
    return float(len(skus))


async def test_a_workflow_keeps_its_signature_and_its_handle_gives_its_return_type(
    app: Loom,
) -> None:
    @app.workflow(name="checkout")
    async def checkout(ctx: Context, order_id: str, cents: int = 100) -> dict[str, str]:
        card = await ctx.step(charge, order_id, cents, retry=Retry(attempts=2), name="c")
        assert_type(card, str)
        return {"card": card}

    @app.workflow
    async def plain(ctx: Context) -> int:
        return 7

    handle = await app.start(checkout, "o-1", id="o-1")
    assert_type(handle, Handle[dict[str, str]])
    result = await handle.result()
    assert_type(result, dict[str, str])
    assert result == {"card": "o-1:100"}

    executed = await app.execute(checkout, "o-2", 5, id="o-2")
    assert_type(executed, dict[str, str])
    assert executed == {"card": "o-2:5"}
    assert_type(await app.execute(plain), int)

    # By name, or by id alone, the checker cannot know the body: a JSON value.
    by_name = await app.start("checkout", "o-3", id="o-3")
    assert_type(by_name, Handle[JsonValue])
    assert await by_name.result() == {"card": "o-3:100"}
    got = app.get("o-1")
    assert_type(got, Handle[JsonValue])
    assert await got.result() == {"card": "o-1:100"}


async def test_each_durable_call_gives_its_own_type(app: Loom, clock: VirtualClock) -> None:
    seen: list[object] = []

    @app.workflow(name="calls")
    async def calls(ctx: Context, order_id: str) -> None:
        paid = await ctx.step(charge, order_id, 3)  # async
        assert_type(paid, str)
        held = await ctx.step(reserve, "sku-1")  # sync, run in a thread
        assert_type(held, int)
        named = await ctx.step(functools.partial(label, prefix="X"), order_id)
        assert_type(named, str)
        priced = await ctx.step(quote, "a", "b")
        assert_type(priced, float)
        closed = await ctx.step(lambda n: n * 2, held, name="double")
        assert_type(closed, int)
        both = await ctx.gather(ctx.step(charge, "g", 1), ctx.step(reserve, "gg"))
        assert_type(both, tuple[str, int])
        three = await ctx.gather(ctx.step(reserve, "a"), ctx.set_event("mid", 1), ctx.sleep(0))
        assert_type(three, tuple[int, None, None])
        assert_type(await ctx.sleep(1), None)
        assert_type(await ctx.set_event("paid", paid), None)
        # A value typed narrower than JSON is taken, as app.send takes it (the runtime
        # refuses one that is not JSON with NotJsonError).
        totals: dict[str, int] = {"sku-1": held}
        await ctx.set_event("totals", totals)
        message = await ctx.receive("go", timeout=60)
        assert_type(message, JsonValue)
        either = await ctx.receive_any("go", "stop", timeout=60)
        assert_type(either, Received | None)
        assert_type(ctx.now(), datetime)
        assert_type(ctx.random(), float)
        assert_type(ctx.uuid(), uuid.UUID)
        assert_type(ctx.patched("v2"), bool)
        assert_type(ctx.execution_id, str)
        seen.extend([paid, held, named, priced, closed, both, three, message, either])

    handle = await app.start(calls, "o-9", id="calls")
    assert_type(await app.send("calls", "go", {"n": 1}), int)
    assert_type(await app.send("calls", "stop", None), int)
    await clock.advance(1)
    await handle.result(timeout=5)
    assert seen == [
        "o-9:3", 5, "X-o-9", 2.0, 10, ("g:1", 2), (1, None, None), {"n": 1},
        Received("stop", None),
    ]
    assert_type(await app.get_event("calls", "paid"), JsonValue)
    assert await app.get_event("calls", "totals") == {"sku-1": 5}
    assert_type(await app.inspect("calls"), View)
    assert_type(await handle.status(), Status)
    listed = app.executions(status="completed")
    assert_type(listed, AsyncIterator[View])
    assert [view.execution_id async for view in listed] == ["calls"]
    assert_type(await app.cancel("calls"), bool)
    forked = await app.fork("calls", id="calls-2")
    assert_type(forked, Handle[JsonValue])


async def test_the_errors_a_caller_catches_carry_typed_attributes(app: Loom) -> None:
    def broken(order_id: str) -> None:
        raise RuntimeError(f"no stock for {order_id}")

    @app.workflow(name="failing")
    async def failing(ctx: Context) -> str:
        try:
            await ctx.step(broken, "o-1", retry=Retry(attempts=1))
        except StepFailedError as exc:
            assert_type(exc.step, str)
            assert_type(exc.attempts, int)
            assert_type(exc.error_type, str)
            raise
        return "unreached"

    with pytest.raises(WorkflowFailedError) as failed:
        await app.execute(failing, id="f")
    assert_type(failed.value.execution_id, str)
    assert_type(failed.value.error_type, str)
    assert failed.value.error_type == "loom_runtime.errors.StepFailedError"

    @app.workflow(name="waiting")
    async def waiting(ctx: Context) -> None:
        await ctx.receive("never")

    handle = await app.start(waiting, id="w")
    await app.cancel("w", reason="changed my mind")
    with pytest.raises(ExecutionCancelledError) as cancelled:
        await handle.result(timeout=5)
    assert_type(cancelled.value.reason, str | None)
    assert cancelled.value.reason == "changed my mind"

    with pytest.raises(ResumeRefusedError) as refused:
        await app.resume("w", fence_if_parked_at=1)
    assert_type(refused.value.reason, Literal["not-suspended", "nothing-to-answer"])
    assert refused.value.reason == "not-suspended"


async def _calls_the_type_checker_refuses(app: Loom, ctx: Context) -> None:
    """Never run: what the checker alone proves. Each call marked ``# type: ignore`` is
    wrong in a way the runtime finds late or never (a step's argument of the wrong type
    reaches the function as it is)."""

    @app.workflow(name="typed")
    async def typed(ctx: Context, order_id: str) -> str:
        return order_id

    await ctx.step(reserve, 5)  # type: ignore[arg-type]
    await ctx.step(charge, "o-1")  # type: ignore[arg-type]
    await ctx.step(charge, "o-1", 1, 2)  # type: ignore[arg-type, call-arg]
    await ctx.step(label, "o-1", prefix="X")  # type: ignore[call-overload]
    await ctx.step(quote, "a", 1)  # type: ignore[arg-type, call-arg]
    await app.start(typed, 42)  # type: ignore[arg-type]
    await app.start(typed)  # type: ignore[arg-type, call-arg]
    await app.start(typed, "o-1", "extra")  # type: ignore[arg-type, call-arg]
    await app.execute(typed, 42)  # type: ignore[arg-type]
    await ctx.sleep("5")  # type: ignore[arg-type]
    # The decorators hand back the function itself, its signature kept.
    assert_type(await typed(ctx, "o-1"), str)
    await typed(ctx, 42)  # type: ignore[arg-type]

    @app.scheduled(every=60)
    @app.workflow(name="report")
    async def report(ctx: Context, scheduled_at: str) -> int:
        return len(scheduled_at)

    assert_type(await report(ctx, "2026-01-01T00:00:00+00:00"), int)

    @app.workflow()  # type: ignore[type-var]
    def not_async(ctx: Context) -> str:
        return "a body must be async"

    @app.workflow()  # type: ignore[type-var]
    async def no_ctx(order_id: str) -> str:
        return "a body takes ctx first"

    @app.scheduled(every=60)  # type: ignore[type-var]
    @app.workflow(name="dated")
    async def dated(ctx: Context, when: datetime) -> None:
        """A schedule passes the instant as an ISO 8601 str, not a datetime."""
