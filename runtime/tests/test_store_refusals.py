"""What a store refuses or forgets under the runtime: a send whose message the store
refuses leaves no wake row; an inbox deleted with its execution (pruned, the id started
again) is read anew; an id the store leaves too little room after is refused at start."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from loom_runtime import Context
from store_probes import wired

from loom_core import InvalidExecutionIdError, InvalidOptionError, LoomError, PayloadShreddedError

FAR = datetime(2100, 1, 1, tzinfo=UTC)


class KeyDestroyedLike(LoomError):
    """A refusal of the store's (as the crypto decorator's for a shredded subject)."""


async def waits(ctx: Context) -> Any:
    return await ctx.receive("go")


async def test_a_send_whose_message_the_store_refuses_leaves_no_wake_row() -> None:
    async with wired() as w:
        w.app.workflow(name="waits")(waits)
        await w.app.start("waits", id="r")
        await w.app.drain()
        refusal = KeyDestroyedLike("the key of 'r''s subject was destroyed")

        async def refuse_inbox(execution_id: str, kinds: tuple[str, ...]) -> None:
            if execution_id.startswith("$inbox:"):
                raise refusal

        w.probe.before_append = refuse_inbox
        rows_before = await w.base.timers.due(FAR)
        with pytest.raises(KeyDestroyedLike):
            await w.app.send("r", "go", 1)
        assert await w.base.timers.due(FAR) == rows_before
        w.probe.before_append = None
        await w.app.send("r", "go", 2)
        assert await w.app.get("r").result(timeout=5) == 2


async def test_an_inbox_deleted_with_its_execution_is_read_anew_when_the_id_starts_again(
) -> None:
    async with wired() as w:
        w.app.workflow(name="waits")(waits)
        await w.app.start("waits", id="o")
        await w.app.send("o", "go", "first", key="go-1")
        assert await w.app.get("o").result(timeout=5) == "first"
        # Pruned: the log and its inbox; then the id is used again.
        for stream in ("o", "$inbox:o"):
            await w.base.events.delete_execution(stream)
        await w.app.start("waits", id="o")
        await w.app.drain()
        assert (await w.app.inspect("o")).status == "suspended"  # not the old message
        await w.app.send("o", "go", "second", key="go-1")  # the old key is gone with it
        assert await w.app.get("o").result(timeout=5) == "second"


async def test_an_id_whose_inbox_the_store_would_refuse_is_refused_at_start() -> None:
    """A decorator that takes room from every id (the tenant decorator's prefix) leaves a
    long id room, but not its inbox's: refused before anything is written."""
    limit = 400  # what such a store leaves of the kernel's 512 bytes
    async with wired() as w:

        def refuse_long(execution_id: str) -> None:
            if len(execution_id.encode()) > limit:
                raise InvalidExecutionIdError(execution_id, f"at most {limit} bytes here")

        w.probe.after_read = refuse_long
        w.app.workflow(name="waits")(waits)
        long_id = "x" * (limit - 10)
        with pytest.raises(InvalidExecutionIdError, match="use a shorter id"):
            await w.app.start("waits", id=long_id)
        assert await w.base.events.read(long_id) == ()
        assert await w.base.timers.due(FAR) == ()
        fits = "x" * (limit - 40)
        await w.app.start("waits", id=fits)
        await w.app.send(fits, "go", "ok")
        assert await w.app.get(fits).result(timeout=5) == "ok"



async def one_step(ctx: Context) -> str:
    return await ctx.step(lambda: "done", name="only")


@pytest.mark.parametrize(
    "refusal",
    [
        InvalidOptionError("the subject's key function failed; nothing was written"),
        PayloadShreddedError("started", 1, "alice"),
    ],
    ids=["bad input", "shredded"],
)
async def test_a_write_a_layer_refuses_for_good_ends_result_and_execute_with_its_error(
    refusal: LoomError,
) -> None:
    refused_as = type(refusal)
    async with wired() as w:
        w.app.workflow(name="one_step")(one_step)

        async def refuse_steps(execution_id: str, kinds: tuple[str, ...]) -> None:
            if "STEP_COMPLETED" in kinds:
                raise refusal

        w.probe.before_append = refuse_steps
        handle = await w.app.start("one_step", id="started")
        with pytest.raises(refused_as):
            await handle.result(timeout=5)
        with pytest.raises(refused_as):
            await w.app.execute("one_step", id="executed")
        for execution_id in ("started", "executed"):
            assert (await w.app.inspect(execution_id)).status == "running"  # as after a crash
        assert w.errors == [refusal, refusal]
        # Once the store writes again, the node's recovery carries both on.
        w.probe.before_append = None
        await w.app.recover()
        assert await handle.result(timeout=5) == "done"
        assert await w.app.get("executed").result(timeout=5) == "done"


async def test_a_send_to_an_execution_whose_log_cannot_be_read_stores_nothing() -> None:
    async with wired() as w:
        w.app.workflow(name="waits")(waits)
        await w.app.start("waits", id="r")
        await w.app.drain()
        shredded = KeyDestroyedLike("'r''s payloads were shredded")

        def unreadable(execution_id: str) -> None:
            if execution_id == "r":
                raise shredded

        w.probe.after_read = unreadable
        rows_before = await w.base.timers.due(FAR)
        with pytest.raises(KeyDestroyedLike):
            await w.app.send("r", "go", 1)
        assert await w.base.events.head("$inbox:r") == 0
        assert await w.base.timers.due(FAR) == rows_before
