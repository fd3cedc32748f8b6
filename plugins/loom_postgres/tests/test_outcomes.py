"""Write outcomes when the client's connection is cut while the server runs the write.

A relay the test controls sits on 127.0.0.1 between the store and the server. It reads
the wire protocol in both directions, so it knows which message carries a trial's write
(the first Bind whose parameters hold the trial's execution id), the server process that
runs it (the BackendKeyData of that connection) and where the server's reply ends. It
cuts that one connection at a point chosen by the trial's index, never by timing:

* before the request reaches the server;
* after it did, while the server is blocked inside the write on a row lock the test holds;
* after it did, with no reply yet (the server runs on, unhindered);
* after the server's whole reply arrived (it has committed), forwarding none of it;
* in the middle of the reply.

Every other connection is relayed untouched, so the store can reconnect and find out what
happened. Each outcome must be the events written exactly once (read back through a
connection of its own) or WriteOutcomeUnknownError: never a conflict for an append that
landed, never a loss, never a duplicate. Each trial also asserts that the relay cut where
it was told to.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import struct
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from loom_core import AppendRequest, Event, NewEvent, Storage, open_storage
from loom_core.errors import LoomError, WriteOutcomeUnknownError

Conn = psycopg.AsyncConnection[tuple[object, ...]]
Path = Literal["append", "append_many"]

TRIALS_PER_PATH = 100  # 200 in all
_PROTOCOL_3 = 196608
_CANCEL_REQUEST = 80877102


class Cut(enum.Enum):
    """Where the relay cuts the connection that carries a trial's write."""

    BEFORE_REQUEST = "the write's Bind arrived; none of it forwarded"
    BLOCKED = "the request forwarded; the server waits inside it for a lock the test holds"
    IN_FLIGHT = "the request forwarded through Sync; no reply yet"
    AFTER_COMMIT = "the server's whole reply received (committed); none of it forwarded"
    MID_REPLY = "the server's whole reply received; only part of it forwarded"


CUTS = tuple(Cut)


@dataclass
class Trial:
    """One armed cut, and what the relay saw and did."""

    index: int
    marker: bytes
    cut: Cut
    before_cut: Callable[[int], Awaitable[str]] | None = None
    fired: bool = False
    pid: int | None = None
    statement: str | None = None
    request_forwarded: bool = False
    waited_on: str | None = None
    reply: bytearray = field(default_factory=bytearray)
    reply_at_cut: int = 0
    reply_complete: bool = False
    reply_forwarded: int = 0
    cut_done: bool = False
    resends: int = 0
    resent: asyncio.Event = field(default_factory=asyncio.Event)


def _cstrings(body: bytes, count: int) -> list[str]:
    out: list[str] = []
    at = 0
    for _ in range(count):
        end = body.index(b"\0", at)
        out.append(body[at:end].decode())
        at = end + 1
    return out


async def _message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One typed protocol message: (type byte, the whole message)."""
    head = await reader.readexactly(5)
    (length,) = struct.unpack("!i", head[1:])
    return head[:1], head + await reader.readexactly(length - 4)


class _Link:
    """One client connection and its server connection."""

    def __init__(
        self,
        relay: CuttingRelay,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.relay = relay
        self.creader, self.cwriter = client
        self.sreader, self.swriter = server
        self.pid: int | None = None
        self.statements: dict[str, str] = {}
        self.victim: Trial | None = None

    async def run(self) -> None:
        up = asyncio.create_task(self._upstream())
        down = asyncio.create_task(self._downstream())
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        self.shut()
        for task in (up, down):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def shut(self) -> None:
        for writer in (self.swriter, self.cwriter):
            writer.close()

    def cut(self) -> None:
        assert self.victim is not None
        self.victim.cut_done = True
        self.victim.reply_at_cut = len(self.victim.reply)
        # close() sends what is buffered, then FIN: the server gets the whole request.
        self.shut()

    async def _upstream(self) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            head = await self.creader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            self.swriter.write(head + await self.creader.readexactly(length - 8))
            if code == _CANCEL_REQUEST:
                return
            assert code == _PROTOCOL_3, f"unexpected startup code {code} (SSL must be off)"
            while True:
                kind, message = await _message(self.creader)
                body = message[5:]
                if kind == b"P":
                    name, query = _cstrings(body, 2)
                    self.statements[name] = query
                elif kind == b"B" and self._bind(body):
                    return  # cut before the request was forwarded
                self.swriter.write(message)
                victim = self.victim
                if kind == b"S" and victim is not None and not victim.request_forwarded:
                    # Handed to the transport, which sends it before any close: forwarded.
                    victim.request_forwarded = True
                    await self.swriter.drain()
                    if victim.cut in (Cut.BLOCKED, Cut.IN_FLIGHT):
                        if victim.before_cut is not None:
                            assert self.pid is not None
                            victim.waited_on = await victim.before_cut(self.pid)
                        self.cut()
                        return

    def _bind(self, body: bytes) -> bool:
        """Watch a Bind; True when it is the trial's write and the cut is before it."""
        statement = self.statements.get(_cstrings(body, 2)[1])
        relay = self.relay
        trial = relay.armed
        if trial is not None and trial.marker in body:
            relay.armed = None
            trial.fired = True
            trial.pid = self.pid
            trial.statement = statement
            self.victim = trial
            if trial.cut is Cut.BEFORE_REQUEST:
                self.cut()
                return True
            return False
        last = relay.last
        if (
            last is not None and last.cut_done and self.victim is None
            and last.marker in body and statement == last.statement
        ):
            last.resends += 1
            last.resent.set()
        return False

    async def _downstream(self) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                kind, message = await _message(self.sreader)
                if kind == b"K":
                    (self.pid,) = struct.unpack("!i", message[5:9])
                victim = self.victim
                if victim is None:
                    self.cwriter.write(message)
                    await self.cwriter.drain()
                    continue
                victim.reply += message
                if kind != b"Z":
                    continue
                victim.reply_complete = True
                if victim.cut is Cut.MID_REPLY:
                    size = len(victim.reply)
                    victim.reply_forwarded = 1 + (victim.index * 7) % (size - 1)
                    self.cwriter.write(bytes(victim.reply[: victim.reply_forwarded]))
                    await self.cwriter.drain()
                if victim.cut in (Cut.AFTER_COMMIT, Cut.MID_REPLY):
                    self.cut()
                    return


class CuttingRelay:
    """A TCP relay to ``host:port`` that cuts the connection of one armed trial."""

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.armed: Trial | None = None
        self.last: Trial | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def arm(self, trial: Trial) -> None:
        self.armed = self.last = trial

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            server = await asyncio.open_connection(self._host, self._port)
        except OSError:
            cwriter.close()
            return
        task = asyncio.current_task()
        assert task is not None
        link = _Link(self, (creader, cwriter), server)
        self._links.add(link)
        self._tasks.add(task)
        try:
            await link.run()
        finally:
            self._links.discard(link)
            self._tasks.discard(task)

    async def close(self) -> None:
        """Stop accepting, and close every link (each then ends on its own)."""
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.shut()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Rig:
    direct: Storage
    proxied: Storage
    relay: CuttingRelay
    admin: Conn
    holder: Conn


@pytest.fixture
async def rig(pg_url: str, schema: str) -> AsyncIterator[Rig]:
    direct = await open_storage(pg_url, options={"schema": schema})
    parts = urlsplit(pg_url)
    assert parts.hostname is not None
    assert parts.port is not None
    relay = CuttingRelay(parts.hostname, parts.port)
    await relay.start()
    user = f"{parts.username}@" if parts.username else ""
    relayed = urlunsplit(
        parts._replace(
            netloc=f"{user}127.0.0.1:{relay.port}", query="sslmode=disable&gssencmode=disable"
        )
    )
    proxied = await open_storage(relayed, options={"schema": schema, "pool_min_size": 1})
    admin: Conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    holder: Conn = await psycopg.AsyncConnection.connect(pg_url)
    await holder.execute("SELECT set_config('search_path', %s, false)", (schema,))
    await holder.commit()
    try:
        yield Rig(direct, proxied, relay, admin, holder)
    finally:
        await proxied.close()
        await relay.close()
        await direct.close()
        await holder.close()
        await admin.close()


def _blocked_on_lock(admin: Conn) -> Callable[[int], Awaitable[str]]:
    async def wait(pid: int) -> str:
        while True:
            cur = await admin.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cur.fetchone()
            if row is not None and row[0] == "Lock":
                return "Lock"
            await asyncio.sleep(0.002)

    return wait


def _check_window(trial: Trial) -> None:
    """The relay cut the trial's own connection exactly where the trial asked."""
    where = f"trial {trial.index} ({trial.cut.name})"
    assert trial.fired, f"{where}: the write never went through the relay"
    assert trial.cut_done, f"{where}: the relay did not cut"
    assert trial.pid is not None, f"{where}: no server process for the cut connection"
    if trial.cut is Cut.BEFORE_REQUEST:
        assert not trial.request_forwarded, where
        assert not trial.reply, where
        return
    assert trial.request_forwarded, f"{where}: the request did not reach the server"
    if trial.cut is Cut.BLOCKED:
        assert trial.waited_on == "Lock", where
        assert trial.reply_at_cut == 0, f"{where}: the server replied while blocked"
    elif trial.cut is Cut.IN_FLIGHT:
        assert trial.reply_forwarded == 0, where
    else:
        assert trial.reply_complete, f"{where}: the cut came before the reply's end"
        assert b"E" not in _kinds(bytes(trial.reply)), f"{where}: the write failed"
        if trial.cut is Cut.AFTER_COMMIT:
            assert trial.reply_forwarded == 0, where
        else:
            assert 0 < trial.reply_forwarded < len(trial.reply), where


def _kinds(reply: bytes) -> list[bytes]:
    kinds: list[bytes] = []
    at = 0
    while at < len(reply):
        kinds.append(reply[at : at + 1])
        (length,) = struct.unpack("!i", reply[at + 1 : at + 5])
        at += 1 + length
    return kinds


async def _run_trial(rig: Rig, index: int, path: Path) -> str:
    cut = CUTS[index % len(CUTS)]
    eid = f"cut{index:03d}-{uuid.uuid4().hex[:12]}"
    ids = [eid] if path == "append" else [eid, f"{eid}-b", f"{eid}-c"]
    # The blocked cut needs a head row to hold; the others alternate creating and extending.
    creating = cut is not Cut.BLOCKED and (index // len(CUTS)) % 2 == 0
    fenced = not creating and (index // (2 * len(CUTS))) % 2 == 0
    fence = 1 if fenced else None
    seed: dict[str, list[tuple[int, str, object]]] = {i: [] for i in ids}
    if not creating:
        for i in ids:
            await rig.direct.events.append(
                i, [NewEvent("EXECUTION_STARTED", {"seed": i})], expected_sequence=0
            )
            seed[i].append((0, "EXECUTION_STARTED", {"seed": i}))
            if fenced:
                assert await rig.direct.events.acquire_fence(i) == 1
    start = 0 if creating else 1
    batches = {
        i: [NewEvent("STEP_COMPLETED", {"trial": index, "id": i, "n": n}) for n in range(2)]
        for i in ids
    }
    trial = Trial(index, eid.encode(), cut)
    if cut is Cut.BLOCKED:
        trial.before_cut = _blocked_on_lock(rig.admin)
        await rig.holder.execute(
            "SELECT 1 FROM loom_executions WHERE execution_id = %s FOR UPDATE", (ids[0],)
        )

    async def write() -> tuple[tuple[Event, ...], ...]:
        if path == "append":
            return (
                await rig.proxied.events.append(
                    eid, batches[eid], expected_sequence=start, fence=fence
                ),
            )
        return await rig.proxied.events.append_many(
            [AppendRequest(i, batches[i], expected_sequence=start, fence=fence) for i in ids]
        )

    rig.relay.arm(trial)
    result: tuple[tuple[Event, ...], ...] | LoomError
    try:
        async with asyncio.timeout(60):  # a hang guard, not a measurement
            task = asyncio.create_task(write())
            if cut is Cut.BLOCKED:
                # Let the lock go once the store has sent the write again (or given up):
                # the lost transaction, if it still lives, is then first in the queue.
                resent = asyncio.create_task(trial.resent.wait())
                await asyncio.wait({task, resent}, return_when=asyncio.FIRST_COMPLETED)
                resent.cancel()
                await rig.holder.rollback()
            try:
                result = await task
            except LoomError as exc:
                result = exc
    finally:
        rig.relay.armed = None
        if cut is Cut.BLOCKED:
            await rig.holder.rollback()

    _check_window(trial)
    where = f"trial {index} ({path}, {cut.name}, creating={creating}, fenced={fenced})"
    logs = {i: await rig.direct.events.read(i) for i in ids}
    expected = {
        i: [(start + n, e.kind, e.payload) for n, e in enumerate(batches[i])] for i in ids
    }
    tails: dict[str, list[tuple[int, str, object]]] = {}
    for i in ids:
        got: list[tuple[int, str, object]] = [(e.sequence, e.kind, e.payload) for e in logs[i]]
        assert got[:start] == seed[i], f"{where}: {i}'s earlier events changed: {got}"
        tails[i] = got[start:]
        if fenced:
            assert all(e.metadata.get("fence") == 1 for e in logs[i][start:]), where
    landed = all(tails[i] == expected[i] for i in ids)
    absent = all(tails[i] == [] for i in ids)
    if isinstance(result, WriteOutcomeUnknownError):
        assert landed or absent, f"{where}: unknown outcome, and the log is {tails}"
        outcome = "unknown, landed" if landed else "unknown, absent"
    else:
        assert not isinstance(result, LoomError), (
            f"{where}: {type(result).__name__}: {result}; the log holds {tails}"
        )
        assert landed, f"{where}: acknowledged, yet the log holds {tails}"
        returned = [[(e.sequence, e.kind, e.payload) for e in events] for events in result]
        assert returned == [expected[i] for i in ids], f"{where}: returned {returned}"
        outcome = "written"
    return f"{outcome}; the store {'sent it again' if trial.resends else 'did not resend'}"


@pytest.mark.parametrize("path", ["append", "append_many"])
async def test_a_cut_connection_leaves_the_write_whole_once_or_reported_unknown(
    rig: Rig, path: Path
) -> None:
    outcomes: Counter[tuple[str, str]] = Counter()
    for index in range(TRIALS_PER_PATH):
        outcome = await _run_trial(rig, index, path)
        outcomes[(CUTS[index % len(CUTS)].name, outcome)] += 1
    for (cut, outcome), count in sorted(outcomes.items()):
        print(f"{path} {cut}: {outcome}: {count}")
    assert sum(outcomes.values()) == TRIALS_PER_PATH
