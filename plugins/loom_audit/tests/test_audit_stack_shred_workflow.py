"""Shredding a workflow through crypto over the audit chain: with the runtime's
``execution_subject``, one erasure covers the execution, its inbox and every generation
continue-as-new made of it, and the chain still verifies; executions shredded while parked
or running are answered with PayloadShreddedError and hold up no other."""

from __future__ import annotations

import asyncio

import pytest
from loom_audit import verify
from loom_crypto import KeyDestroyedError, MemoryKeyStore, shred_subject, subject_is_execution
from loom_runtime import Context, Loom, execution_subject
from loom_runtime.testing import VirtualClock

from loom_core import NewEvent, PayloadShreddedError, open_storage

STREAMS = ("order-42", "$inbox:order-42", "order-42#1", "$inbox:order-42#1")


async def _run_and_shred(subject_of: object) -> dict[str, bool]:
    """Run a workflow that takes a message and continues as new once, shred
    ``order-42``; which of its streams can no longer be read."""
    storage = await open_storage(
        "memory://",
        decorators=["audit", ("crypto", {"key_store": MemoryKeyStore(), "subject_of": subject_of})],
    )
    app = Loom(storage, node="n1", on_error=lambda error: None)

    @app.workflow(name="addressed")
    async def addressed(ctx: Context, card: str, generation: int) -> object:
        address = await ctx.receive("address")
        if generation == 0:
            ctx.continue_as_new(card, 1)
        return address

    try:
        async with app:
            await app.start(addressed, "4111-1111", 0, id="order-42")
            await app.drain()
            await app.send("order-42", "address", {"street": "1 Private Lane"})
            await app.drain()
            await app.send("order-42", "address", {"street": "2 Private Lane"})
            assert await app.get("order-42").result(timeout=5) == {"street": "2 Private Lane"}
            await shred_subject(storage, "order-42")
            unreadable: dict[str, bool] = {}
            for stream in STREAMS:
                assert await storage.events.head(stream) > 0, stream
                assert (await verify(storage, stream)).ok, stream
                try:
                    await storage.events.read(stream)
                except PayloadShreddedError:
                    unreadable[stream] = True
                else:
                    unreadable[stream] = False
            return unreadable
    finally:
        await storage.close()


async def test_one_erasure_covers_an_execution_its_inbox_and_its_successors() -> None:
    assert await _run_and_shred(execution_subject) == dict.fromkeys(STREAMS, True)


async def test_with_every_stream_its_own_subject_the_inbox_and_successors_stay_readable(
) -> None:
    # Why the runtime's subject function exists: each stream would be a subject of its own.
    assert await _run_and_shred(subject_is_execution) == {
        "order-42": True,
        "$inbox:order-42": False,
        "order-42#1": False,
        "$inbox:order-42#1": False,
    }


@pytest.mark.parametrize(
    ("stream", "subject"),
    [
        ("order-42", "order-42"),
        ("$inbox:order-42", "order-42"),
        ("order-42#7", "order-42"),
        ("$inbox:order-42#12", "order-42"),
        ("a#b", "a#b"),
        ("x$inbox:y", "x$inbox:y"),
    ],
)
def test_the_subject_is_the_first_execution_of_the_chain(stream: str, subject: str) -> None:
    assert execution_subject(stream, NewEvent("X")) == subject


async def test_executions_shredded_while_parked_or_running_hold_up_no_other() -> None:
    # The erasure comes before the cancel the docs ask for: the runtime must answer each
    # call on a shredded execution with PayloadShreddedError, at once, and go on with
    # the others.
    clock = VirtualClock()
    errors: list[BaseException] = []
    keys = MemoryKeyStore()
    storage = await open_storage(
        "memory://",
        decorators=["audit", ("crypto", {"key_store": keys, "subject_of": execution_subject})],
    )
    app = Loom(storage, node="n1", clock=clock, on_error=errors.append, timers=False,
               recover=False)
    entered, released = asyncio.Event(), asyncio.Event()

    async def slow(label: str) -> str:
        entered.set()
        await released.wait()
        return label

    @app.workflow(name="nap")
    async def nap(ctx: Context) -> str:
        await ctx.sleep(60)
        return "awake"

    @app.workflow(name="addressed")
    async def addressed(ctx: Context) -> object:
        return await ctx.receive("address")

    @app.workflow(name="busy")
    async def busy(ctx: Context) -> str:
        return await ctx.step(slow, "done")

    try:
        async with app:
            for execution_id in ("gone", "kept"):
                await app.start(nap, id=execution_id)
            await app.start(addressed, id="mute")
            await app.drain()
            running = await app.start(busy, id="busy")
            await entered.wait()
            for subject in ("gone", "mute", "busy"):
                await shred_subject(storage, subject)

            await clock.advance(60)
            fired = await app.timer_service.poll_once()
            assert {row.execution_id: what for row, what in fired.items()} == {
                "gone": "backing-off", "kept": "resumed"
            }
            assert await app.get("kept").result(timeout=5) == "awake"
            with pytest.raises(PayloadShreddedError):
                await app.get("gone").result(timeout=5)

            inbox = await storage.events.head("$inbox:mute")
            with pytest.raises(PayloadShreddedError):
                await app.send("mute", "address", {"street": "1 Private Lane"})
            assert await storage.events.head("$inbox:mute") == inbox
            with pytest.raises(PayloadShreddedError):
                await app.cancel("mute")

            released.set()  # its step ends; its result cannot be sealed any more
            with pytest.raises(PayloadShreddedError):
                await running.result(timeout=5)
            assert [h.execution_id for h in await app.recover()] == []
            assert {type(e) for e in errors} <= {PayloadShreddedError, KeyDestroyedError}
            for stream in ("gone", "kept", "mute", "busy"):
                assert (await verify(storage, stream)).ok, stream
    finally:
        await storage.close()
