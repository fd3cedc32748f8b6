"""Messages: stored once, delivered once, whatever the clock says when they are sent."""

from __future__ import annotations

from loom_runtime import Context, Loom
from loom_runtime.testing import VirtualClock

from loom_core import EventKind


async def test_a_message_sent_at_the_instant_an_answered_sleep_woke_is_delivered(
    app: Loom, clock: VirtualClock
) -> None:
    """The send's wake row is written at the sender's now, which here is the wake time of
    the sleep the timer service just answered: the row must not be taken for that
    sleep's and retired while the receiver waits for the message."""

    @app.workflow()
    async def nap_then_read(ctx: Context) -> object:
        await ctx.sleep(30)
        return await ctx.receive("note")

    handle = await app.start(nap_then_read, id="reader")
    await app.drain()
    await clock.advance(30)
    await app.drain()
    assert await handle.status() == "suspended"
    await app.send("reader", "note", "on time")
    await app.drain()
    assert await handle.status() == "completed"
    assert await handle.result(timeout=5) == "on time"
    kinds = [e.kind for e in await app.storage.events.read("reader")]
    assert kinds.count(EventKind.MESSAGE_CONSUMED) == 1
