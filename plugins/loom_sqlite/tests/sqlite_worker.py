"""Subprocess roles for the multi-process tests (run as ``python sqlite_worker.py ROLE ARGS``).

Each role opens the SQLite storage itself, in its own process, and reports on stdout one
line per fact the test needs, flushed as soon as it is true.

- ``open URL``: open the storage (creating or migrating it) once told ``go`` on stdin,
  schedule a re-drive timer, print ``opened``.
- ``race URL ROLE ID... ``: for each id, wait for ``go``, read the park, print
  ``<id> read``, then either ``resume`` (append an EXECUTION_RESUMED fenced with the park's
  token) or ``acquire`` (acquire_fence_if on the park); print ``<id> ok`` or
  ``<id> stale <token>``. The test may hold the file's write lock until both racers have
  read, so both judge the same park and both writes wait on the lock together.
- ``fenced URL ID ROUNDS NAME``: acquire a fence and append under it, over and over,
  printing ``ack <seq> <token>`` for every append the store accepted.
- ``append URL ID SEQ``: append one application event at SEQ.
- ``acquire URL ID``: take a fence on ID and print ``token N``.
- ``zygote URL``: preload everything, then fork one ``writer`` child per ``go SEED`` line
  and report ``pid N``, the child's ``ack`` lines, and ``dead N`` once it is reaped; the
  parent SIGKILLs the child (forking a warm process keeps 200 kills fast).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Sequence

from loom_core import (
    AppendRequest,
    ConflictError,
    FenceAcquired,
    NewEvent,
    Redrive,
    StaleFenceError,
    TimerRecord,
    open_storage,
)
from loom_core.spi import EventStore, default_plugins

EPOCH_WAKE = "2030-01-01T00:00:00+00:00"
WRITER_EXECUTIONS = ("durable-a", "durable-b", "durable-c")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected 'go', got {line!r}")


async def role_open(url: str) -> None:
    from datetime import datetime

    wait_for_go()
    async with open_storage(url) as storage:
        await storage.timers.schedule(
            TimerRecord(f"migrated-{os.getpid()}", datetime.fromisoformat(EPOCH_WAKE), Redrive(0))
        )
        say("opened")


async def role_race(url: str, role: str, ids: Sequence[str]) -> None:
    async with open_storage(url) as storage:
        events = storage.events
        say("ready")
        for execution_id in ids:
            wait_for_go()
            # The park is at sequence 1 (the test wrote STARTED, SUSPENDED); the rival's
            # answer may already follow it.
            (park,) = await events.read(execution_id, from_sequence=1, to_sequence=1)
            say(f"{execution_id} read")
            if role == "resume":
                try:
                    await events.append(
                        execution_id,
                        [NewEvent("EXECUTION_RESUMED", {"by": os.getpid()})],
                        expected_sequence=2,
                        fence=park.fence,
                    )
                    say(f"{execution_id} ok")
                except StaleFenceError as exc:
                    say(f"{execution_id} stale {exc.current_fence}")
            else:
                result = await events.acquire_fence_if(
                    execution_id, fence=park.fence, park_seq=park.sequence
                )
                if isinstance(result, FenceAcquired):
                    say(f"{execution_id} ok")
                else:
                    say(f"{execution_id} stale {result.fence}")


async def role_fenced(url: str, execution_id: str, rounds: int, name: str) -> None:
    async with open_storage(url) as storage:
        events = storage.events
        say("ready")
        wait_for_go()
        for _ in range(rounds):
            token = await events.acquire_fence(execution_id)
            for _ in range(3):
                head = await events.head(execution_id)
                try:
                    written = await events.append(
                        execution_id,
                        [NewEvent("STEP_COMPLETED", {"writer": name, "token": token})],
                        expected_sequence=head,
                        fence=token,
                    )
                except ConflictError:  # stale, head moved, or the rival created it first
                    break
                say(f"ack {written[0].sequence} {token}")
        say("done")


async def role_append(url: str, execution_id: str, sequence: int) -> None:
    async with open_storage(url) as storage:
        await storage.events.append(
            execution_id, [NewEvent("order.shipped", {"from": "other"})], expected_sequence=sequence
        )
        say("appended")


async def role_acquire(url: str, execution_id: str) -> None:
    async with open_storage(url) as storage:
        say(f"token {await storage.events.acquire_fence(execution_id)}")


async def _writer_task(events: EventStore, execution_id: str, rng: random.Random) -> None:
    head = await events.head(execution_id)
    while True:
        count = rng.randint(1, 3)
        batch = [NewEvent("STEP_COMPLETED", {"n": head + i, "of": count}) for i in range(count)]
        await events.append(execution_id, batch, expected_sequence=head)
        say(f"ack {execution_id} {head} {count}")
        head += count


async def _writer_many(events: EventStore, execution_id: str, rng: random.Random) -> None:
    # Two executions in one atomic append_many: both land or neither does.
    left, right = f"{execution_id}-l", f"{execution_id}-r"
    heads = [await events.head(left), await events.head(right)]
    while True:
        count = rng.randint(1, 2)
        await events.append_many(
            [
                AppendRequest(
                    eid,
                    [
                        NewEvent("STEP_COMPLETED", {"n": head + i, "of": count})
                        for i in range(count)
                    ],
                    head,
                )
                for eid, head in ((left, heads[0]), (right, heads[1]))
            ]
        )
        say(f"ack {left} {heads[0]} {count}")
        say(f"ack {right} {heads[1]} {count}")
        heads = [heads[0] + count, heads[1] + count]


async def role_writer(url: str, seed: int) -> None:
    rng = random.Random(seed)
    async with open_storage(url) as storage:
        events = storage.events
        await asyncio.gather(
            *(_writer_task(events, eid, rng) for eid in WRITER_EXECUTIONS),
            _writer_many(events, "durable-m", rng),
        )


def role_zygote(url: str) -> None:
    # Discover the plugins once, here: every forked writer inherits the result.
    default_plugins().backend_for("sqlite")
    say("ready")
    for line in sys.stdin:
        command, _, seed = line.strip().partition(" ")
        if command != "go":
            break
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(role_writer(url, int(seed)))
            finally:
                os._exit(1)
        say(f"pid {pid}")
        os.waitpid(pid, 0)
        say(f"dead {pid}")


def main(argv: Sequence[str]) -> None:
    role, url, *rest = argv
    if role == "open":
        asyncio.run(role_open(url))
    elif role == "race":
        asyncio.run(role_race(url, rest[0], rest[1:]))
    elif role == "fenced":
        asyncio.run(role_fenced(url, rest[0], int(rest[1]), rest[2]))
    elif role == "append":
        asyncio.run(role_append(url, rest[0], int(rest[1])))
    elif role == "acquire":
        asyncio.run(role_acquire(url, rest[0]))
    elif role == "zygote":
        role_zygote(url)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
