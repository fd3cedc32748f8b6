"""``app.executions()``: every execution in the store, folded, filtered by status and
workflow; the runtime's own streams and streams it did not start are left out."""

from __future__ import annotations

import random

import pytest
from loom_runtime import (
    AppNotRunningError,
    Context,
    LogFormatError,
    Loom,
    WorkflowNotFoundError,
)
from loom_runtime.testing import VirtualClock

from loom_core import EventKind, InvalidInputError, NewEvent, open_storage


async def listed(app: Loom, **filters: object) -> list[tuple[str, str | None]]:
    return [(v.execution_id, v.status) async for v in app.executions(**filters)]  # type: ignore[arg-type]


async def test_it_lists_every_execution_with_its_status_and_filters_them(app: Loom) -> None:
    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    @app.workflow()
    async def waits(ctx: Context) -> object:
        return await ctx.receive("go")

    @app.workflow()
    async def breaks(ctx: Context) -> None:
        raise RuntimeError("broken")

    @app.workflow(name="hands_on")
    async def hands_on(ctx: Context, n: int) -> int:
        if n == 0:
            return 0
        ctx.continue_as_new(n - 1)

    await app.execute(quick, id="a-done")
    await app.start(waits, id="b-parked")
    await app.start(waits, id="c-cancelled")
    await app.drain()
    await app.cancel("c-cancelled", reason="test")
    await app.send("b-parked", "other", 1)  # writes its inbox stream, which is not listed
    failed = await app.start(breaks, id="d-failed")
    await app.drain()
    assert await failed.status() == "failed"
    assert await (await app.start(hands_on, 1, id="e-chain")).result(timeout=5) == 0
    # Streams the runtime did not start (an application's own events, or a terminal
    # kind written by hand) are not listed.
    await app.storage.events.append(
        "f-not-mine", [NewEvent("ORDER_PLACED", {"n": 1})], expected_sequence=0
    )
    await app.storage.events.append(
        "g-not-mine", [NewEvent(EventKind.EXECUTION_COMPLETED, {"result": 1})],
        expected_sequence=0,
    )

    assert await listed(app) == [
        ("a-done", "completed"),
        ("b-parked", "suspended"),
        ("c-cancelled", "cancelled"),
        ("d-failed", "failed"),
        ("e-chain", "continued"),
        ("e-chain#1", "completed"),
    ]
    assert await listed(app, status="suspended") == [("b-parked", "suspended")]
    assert await listed(app, status=("failed", "cancelled")) == [
        ("c-cancelled", "cancelled"),
        ("d-failed", "failed"),
    ]
    assert await listed(app, workflow=waits) == [
        ("b-parked", "suspended"),
        ("c-cancelled", "cancelled"),
    ]
    assert await listed(app, workflow="hands_on", status={"completed"}) == [
        ("e-chain#1", "completed")
    ]
    views = [v async for v in app.executions(workflow=hands_on)]
    assert [(v.root, v.generation) for v in views] == [("e-chain", 0), ("e-chain", 1)]
    # A name this app does not register is a filter all the same (an operator's script).
    assert await listed(app, workflow="somebody.elses") == []


async def test_it_pages_through_a_store_of_more_executions_than_a_page(app: Loom) -> None:
    @app.workflow()
    async def quick(ctx: Context, k: int) -> int:
        return k

    for k in range(230):
        await app.execute(quick, k, id=f"x-{k:04d}")
    ids = [v.execution_id async for v in app.executions(status="completed")]
    assert ids == [f"x-{k:04d}" for k in range(230)]


async def test_an_unreadable_log_goes_to_on_error_and_the_listing_goes_on(app: Loom) -> None:
    @app.workflow()
    async def quick(ctx: Context) -> str:
        return "done"

    await app.execute(quick, id="a")
    await app.storage.events.append(
        "b", [NewEvent(EventKind.EXECUTION_STARTED, {"workflow": 7})], expected_sequence=0
    )
    await app.execute(quick, id="c")
    assert await listed(app) == [("a", "completed"), ("c", "completed")]
    reported = app.reported  # type: ignore[attr-defined]
    assert len(reported) == 1
    assert isinstance(reported[0], LogFormatError)
    assert reported[0].execution_id == "b"


@pytest.mark.parametrize(
    ("filters", "error", "says"),
    [
        ({"status": "done"}, InvalidInputError, "status= takes one of"),
        ({"status": ["completed", "finished"]}, InvalidInputError, "status= takes one of"),
        ({"status": []}, InvalidInputError, "status= takes one of"),
        ({"status": 3}, InvalidInputError, "status= takes one of"),
        ({"status": {"completed": 1}}, InvalidInputError, "status= takes one of"),
        ({"workflow": ""}, InvalidInputError, "workflow name"),
        ({"workflow": print}, WorkflowNotFoundError, "print"),
        ({"workflow": 3}, InvalidInputError, "workflow= takes"),
    ],
)
async def test_bad_filters_are_refused_where_they_are_given(
    app: Loom, filters: dict[str, object], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        app.executions(**filters)  # type: ignore[arg-type]


async def test_a_function_under_two_names_lists_the_executions_of_both(app: Loom) -> None:
    """A workflow renamed, its old name kept for the executions started under it: given
    the function, the listing finds them under either name; given a name, under it."""

    async def body(ctx: Context) -> str:
        return "done"

    app.workflow(name="checkout.v1")(body)
    await app.execute("checkout.v1", id="old")
    app.workflow(name="checkout.v2")(body)
    await app.execute(body, id="new")
    assert await listed(app, workflow=body) == [("new", "completed"), ("old", "completed")]
    assert await listed(app, workflow="checkout.v1") == [("old", "completed")]


async def test_a_listing_needs_the_app_running(clock: VirtualClock) -> None:
    app = Loom("memory://", clock=clock, random=random.Random(1))
    with pytest.raises(AppNotRunningError):
        app.executions()


async def test_a_listing_ends_when_the_app_leaves(clock: VirtualClock) -> None:
    errors: list[BaseException] = []
    async with open_storage("memory://") as storage:
        app = Loom(storage, clock=clock, on_error=errors.append)

        @app.workflow()
        async def quick(ctx: Context) -> str:
            return "done"

        async with app:
            for k in range(5):
                await app.execute(quick, id=f"x{k}")
            listing = app.executions()
            first = await anext(listing)
        assert first.execution_id == "x0"
        with pytest.raises(AppNotRunningError):
            await anext(listing)
        assert errors == []  # the rest was not taken for unreadable logs
