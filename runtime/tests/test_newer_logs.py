"""A log a newer loom-runtime wrote, read by this one (a node rolled back, or not yet
upgraded, in a mixed fleet): a kind the newer runtime wrote as its own (stamped
``"kernel": true``, docs/design.md) is refused with LogFormatError saying to upgrade,
and nothing is written; application events and fields this runtime does not know are
passed over, as before."""

from __future__ import annotations

import pytest
from loom_runtime import Context, LogFormatError, Loom
from loom_runtime.fold import fold
from loom_runtime.records import inbox_of
from loom_runtime.testing import VirtualClock

from loom_core import EventKind, JsonObject, NewEvent, open_storage

STARTED: JsonObject = {"workflow": "w", "input": [], "fingerprint": "f", "node": "n"}


class Abort(BaseException):
    pass


def reported(app: Loom) -> list[BaseException]:
    errors: list[BaseException] = app.reported  # type: ignore[attr-defined]
    return errors


async def test_folding_refuses_a_kernel_kind_it_does_not_know_and_passes_over_the_rest(
) -> None:
    async with open_storage("memory://") as storage:
        events = storage.events
        await events.append("e", [
            NewEvent(EventKind.EXECUTION_STARTED, STARTED),
            # An application event, and one whose stamp is not JSON true: passed over.
            NewEvent("ORDER_PLACED", {"id": 1}),
            NewEvent("ORDER_SHIPPED", {}, {"kernel": "true"}),
            # A field a newer runtime added to a kind this one knows: passed over.
            NewEvent(EventKind.EXECUTION_COMPLETED, {"result": 3, "added_later": 1}),
        ], expected_sequence=0)
        view = fold(await events.read("e"))
        assert (view.status, view.result) == ("completed", 3)

        await events.append("n", [
            NewEvent(EventKind.EXECUTION_STARTED, STARTED),
            NewEvent("EXECUTION_PAUSED", {"by": "ops"}, {"kernel": True}),
        ], expected_sequence=0)
        with pytest.raises(LogFormatError) as caught:
            fold(await events.read("n"))
    error = caught.value
    assert (error.execution_id, error.sequence, error.kind) == ("n", 1, "EXECUTION_PAUSED")
    assert "a newer loom-runtime wrote it" in str(error)
    assert "upgrade loom-runtime" in str(error)


async def test_a_recovery_over_a_kernel_kind_a_newer_runtime_wrote_writes_nothing(
    app: Loom,
) -> None:
    abort = [True]

    async def charge() -> str:
        if abort[0]:
            raise Abort
        return "charged"

    @app.workflow(name="w")
    async def w(ctx: Context) -> object:
        return await ctx.step(charge)

    handle = await app.start(w, id="a")
    with pytest.raises(BaseException, match="raised Abort"):
        await handle.result(timeout=5)
    reported(app).clear()
    events = app.storage.events
    # A newer runtime took the execution over meanwhile and paused it, in a kind this
    # runtime does not know; the run here must not carry on as if it were still running.
    newer = await events.acquire_fence("a")
    await events.append(
        "a", [NewEvent("EXECUTION_PAUSED", {"by": "ops"}, {"kernel": True})],
        expected_sequence=1, fence=newer,
    )
    before = await events.read("a")

    abort[0] = False
    await app.recover()
    await app.drain()

    assert await events.read("a") == before
    assert [type(e) for e in reported(app)] == [LogFormatError]
    assert "upgrade loom-runtime" in str(reported(app)[0])
    assert await events.acquire_fence("a") == newer + 1  # the recovery took no token


async def test_a_timer_row_over_a_kernel_kind_a_newer_runtime_wrote_is_reported_once(
    app: Loom, clock: VirtualClock
) -> None:
    """A parked execution whose log a newer runtime went on writing: its timer row is
    tried at each of the service's backoffs for as long as it stays, and on_error hears
    of the LogFormatError once, not at each try."""

    @app.workflow(name="w")
    async def w(ctx: Context) -> object:
        await ctx.sleep(60)
        return "woke"

    handle = await app.start(w, id="a")
    await app.drain()
    assert await handle.status() == "suspended"
    events = app.storage.events
    head = len(await events.read("a"))
    newer = await events.acquire_fence("a")
    await events.append(
        "a", [NewEvent("EXECUTION_PAUSED", {"by": "ops"}, {"kernel": True})],
        expected_sequence=head, fence=newer,
    )
    before = await events.read("a")
    for _ in range(120):  # an hour past the row's time
        await clock.advance(30)
    assert await events.read("a") == before
    assert [type(e) for e in reported(app)] == [LogFormatError]
    assert [row.execution_id for row in await app.storage.timers.pending("a")] == ["a"]
    attempts, _ = app.timer_service.backing_off()["a"]
    assert attempts > 10  # tried again and again, reported once


async def test_a_send_to_a_log_a_newer_runtime_wrote_returns_its_stored_message(
    app: Loom,
) -> None:
    """app.send stores the message in the receiver's inbox before it delivers it: when the
    delivery finds a kind a newer runtime wrote, the message waits there for a node that
    can read the log, as for a replay that diverges, and send returns its id. Raising
    would tell the caller nothing was sent, and a caller that sends it again (without a
    key) has it received twice once a newer node delivers both."""

    @app.workflow(name="w")
    async def w(ctx: Context) -> object:
        return await ctx.receive("t")

    handle = await app.start(w, id="a")
    await app.drain()
    assert await handle.status() == "suspended"
    events = app.storage.events
    head = len(await events.read("a"))
    newer = await events.acquire_fence("a")
    await events.append(
        "a", [NewEvent("EXECUTION_PAUSED", {"by": "ops"}, {"kernel": True})],
        expected_sequence=head, fence=newer,
    )
    before = await events.read("a")
    sequence = await app.send("a", "t", 1)
    assert await events.read("a") == before  # nothing written to the log
    inbox = await events.read(inbox_of("a"))
    assert [e.sequence for e in inbox] == [sequence]
    stored = inbox[0].payload
    assert isinstance(stored, dict)
    assert (stored["topic"], stored["value"]) == ("t", 1)
    # Its wake row stays, for a node that can read the log to deliver it.
    assert [row.execution_id for row in await app.storage.timers.pending("a")] == ["a"]
