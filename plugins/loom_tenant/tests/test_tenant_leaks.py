"""Cross-tenant reads and writes through every SPI method: none may leak.

Run over an in-memory store and over a real SQLite file. Hostile tenants share one inner
storage and each owns data under the same ids. An
attacker tenant then calls every EventStore, TimerStore and LeaseStore method on the ids a
random victim tenant uses, including ids spelled as the victim's *stored* ids. A leak is
any answer that carries another tenant's data, or any write that changes what the victim
sees. The test counts attempts per method and leaks, and requires 0 leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from loom_tenant import MAX_TENANT_BYTES, TenantCodec, tenant_view

from loom_core import (
    AppendRequest,
    Event,
    FenceNotIssuedError,
    LoomError,
    NewEvent,
    Storage,
    TimerRecord,
    open_storage,
)

TENANTS = [
    "acme",
    "acme/",
    "",
    "4:acme",
    "1:a/",
    "a:b",
    "ü-日本",
    "🙂",
    "x" * MAX_TENANT_BYTES,
]
IDS = ["order-1", "x", "acme/order-1", "4:acme/order-1", "/", ":", "0:/x", "é", "a:b/x"]
T0 = datetime(2030, 1, 1, tzinfo=UTC)
FAR = 2**62  # a fence no execution reaches: an append under it only reads the token
ATTEMPTS = 1_500


@dataclass
class Audit:
    attempts: Counter[str] = field(default_factory=Counter)
    leaks: list[str] = field(default_factory=list)

    def leak(self, what: str) -> None:
        self.leaks.append(what)


@dataclass(frozen=True)
class Snapshot:
    """Everything a tenant can observe about one id."""

    events: tuple[tuple[int, str, object, object], ...]
    head: int
    token: int
    timers: tuple[TimerRecord, ...]
    lease: tuple[str, str] | None


def wake(tenant_index: int, id_index: int) -> datetime:
    return T0 + timedelta(minutes=tenant_index, seconds=id_index)


async def token_of(view: Storage, execution_id: str) -> int:
    """The token of ``execution_id`` as ``view`` sees it, read without writing: an append
    under a token never issued is refused with the current one (the kit's probe)."""
    head = await view.events.head(execution_id)
    try:
        await view.events.append(
            execution_id, [NewEvent("probe")], expected_sequence=head, fence=FAR
        )
    except FenceNotIssuedError as refused:
        return refused.current_fence
    raise AssertionError(f"an append to {execution_id!r} under fence {FAR} was accepted")


async def snapshot(view: Storage, execution_id: str) -> Snapshot:
    events = await view.events.read(execution_id)
    token = await token_of(view, execution_id)
    lease = await view.leases.inspect(execution_id)
    return Snapshot(
        tuple((e.sequence, e.kind, e.payload, e.metadata) for e in events),
        await view.events.head(execution_id),
        token,
        await view.timers.pending(execution_id),
        None if lease is None else (lease.key, lease.holder),
    )


def owned(event: Event, tenant: str) -> bool:
    return isinstance(event.payload, dict) and event.payload.get("owner") == tenant


@pytest.fixture(params=["memory", "sqlite"])
async def world(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Storage, dict[str, Storage]]]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'shared.db'}"
    async with open_storage(url) as shared:
        views = {tenant: tenant_view(shared, tenant) for tenant in TENANTS}
        for t_index, (tenant, view) in enumerate(views.items()):
            for i_index, execution_id in enumerate(IDS):
                await view.events.append(
                    execution_id,
                    [NewEvent("STEP_COMPLETED", {"owner": tenant, "n": n}) for n in range(3)],
                    expected_sequence=0,
                )
                if i_index % 2:
                    await view.events.acquire_fence(execution_id)
                await view.timers.schedule(TimerRecord(execution_id, wake(t_index, i_index)))
                await view.leases.acquire(execution_id, f"holder:{tenant}", ttl_seconds=3600)
        yield shared, views


async def test_cross_tenant_reads_and_writes_through_every_spi_method_leak_nothing(
    world: tuple[Storage, dict[str, Storage]],
) -> None:
    shared, views = world
    rng = random.Random(20301)
    audit = Audit()
    index = {tenant: i for i, tenant in enumerate(TENANTS)}

    def ids_for(attacker: str, victim: str) -> list[str]:
        # The victim's ids as the attacker's own, and the victim's stored forms, which a
        # naive encoding would resolve to the victim's rows.
        codec = TenantCodec(victim)
        crafted = [codec.prefix + i for i in IDS]
        budget = TenantCodec(attacker).id_budget
        return IDS + [c for c in crafted if len(c.encode()) <= budget]

    async def check_read(attacker: str, what: str, events: tuple[Event, ...]) -> None:
        for event in events:
            if not owned(event, attacker):
                audit.leak(f"{what}: {attacker!r} saw {event.payload!r}")

    for attempt in range(ATTEMPTS):
        attacker, victim = rng.sample(TENANTS, 2)
        a, v = views[attacker], views[victim]
        execution_id = rng.choice(ids_for(attacker, victim))
        method = METHODS[attempt % len(METHODS)]
        crafted_from = TenantCodec(victim).decode(execution_id)
        watched = [crafted_from or execution_id]
        before = {i: await snapshot(v, i) for i in watched}
        audit.attempts[method.__name__] += 1
        # A refusal is not a leak; the victim's state is checked below either way.
        with contextlib.suppress(LoomError):
            await method(a, attacker, execution_id, index[attacker], check_read, audit)
        for i in watched:
            if await snapshot(v, i) != before[i]:
                audit.leak(f"{method.__name__} by {attacker!r} on {execution_id!r} changed "
                           f"{victim!r}'s {i!r}")

    # Afterwards every stored id belongs to exactly one tenant, and every tenant's data is
    # its own.
    stored = await shared.events.list_executions(limit=10_000)
    codecs = [TenantCodec(t) for t in TENANTS]
    for s in stored:
        owners = [c.tenant for c in codecs if c.decode(s) is not None]
        if len(owners) != 1:
            audit.leak(f"stored id {s!r} decodes under {owners}")
    for tenant, view in views.items():
        for execution_id in await view.events.list_executions(limit=10_000):
            await check_read(tenant, "final read", await view.events.read(execution_id))

    print(f"\n{sum(audit.attempts.values())} cross-tenant attempts over "
          f"{len(audit.attempts)} methods, {len(audit.leaks)} leaks")
    assert sum(audit.attempts.values()) >= 1_000
    assert set(audit.attempts) == {m.__name__ for m in METHODS}
    assert min(audit.attempts.values()) >= 40
    assert audit.leaks == []


# -- the attacks: one per SPI method ---------------------------------------------------------

CheckRead = Callable[[str, str, tuple[Event, ...]], Awaitable[None]]
Attack = Callable[[Storage, str, str, int, CheckRead, Audit], Awaitable[None]]


def _mine(tenant: str, n: int = 0) -> list[NewEvent]:
    return [NewEvent("STEP_COMPLETED", {"owner": tenant, "n": n})]


async def read(a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit) -> None:
    await check(me, "read", await a.events.read(i, from_sequence=0, limit=50))


async def head(a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit) -> None:
    mine = await a.events.read(i)
    if await a.events.head(i) < len(mine):
        audit.leak(f"head of {i!r} for {me!r} is below its own event count")


async def list_executions(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    listed = await a.events.list_executions(after=None, limit=1000)
    listed += await a.events.list_executions(after=i, limit=1000)
    for execution_id in set(listed):
        await check(me, "list+read", await a.events.read(execution_id))


async def subscribe(a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit) -> None:
    if await a.events.head(i) == 0:
        return
    subscription = a.events.subscribe(i, from_sequence=0)
    try:
        first = await asyncio.wait_for(anext(subscription), 10)
    finally:
        await subscription.aclose()  # type: ignore[attr-defined]
    await check(me, "subscribe", (first,))


async def append(a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit) -> None:
    written = await a.events.append(i, _mine(me), expected_sequence=await a.events.head(i))
    await check(me, "append result", written)


async def acquire_fence(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    before = await token_of(a, i)
    if await a.events.acquire_fence(i) != before + 1:
        audit.leak(f"acquire_fence on {i!r} for {me!r} did not follow its own token")


async def acquire_fence_if(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    current = await token_of(a, i)
    head_ = await a.events.head(i)
    if head_ == 0:
        # No log of ours: refused (ExecutionNotFoundError), whoever else has one.
        await a.events.acquire_fence_if(i, fence=current, park_seq=0)
        audit.leak(f"acquire_fence_if on {i!r} for {me!r} found a log it cannot read")
        return
    result = await a.events.acquire_fence_if(i, fence=current, park_seq=head_ - 1)
    if not result.acquired or result.fence != current + 1:
        audit.leak(f"acquire_fence_if on {i!r} for {me!r} saw another token: {result}")


async def append_if_unchanged(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    token = await token_of(a, i)
    written = await a.events.append_if_unchanged(
        i, _mine(me), expected_sequence=await a.events.head(i), observed_fence=token
    )
    await check(me, "append_if_unchanged result", written)


async def append_many(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    other = "order-1" if i != "order-1" else "x"
    batch = await a.events.append_many(
        [
            AppendRequest(i, _mine(me), await a.events.head(i)),
            AppendRequest(other, _mine(me), await a.events.head(other)),
        ]
    )
    for events in batch:
        await check(me, "append_many result", events)


async def delete_execution(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    await a.events.delete_execution(i)
    if await a.events.read(i):
        audit.leak(f"{me!r} still reads {i!r} after deleting it")
    # Re-create it (a kept fence token is this tenant's own) so later reads have data.
    token = await token_of(a, i)
    await a.events.append(i, _mine(me), expected_sequence=await a.events.head(i), fence=token)


async def copy_prefix(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    head_ = await a.events.head(i)
    if head_ == 0:
        return
    target = f"{i}~copy{random.random()}"
    await a.events.copy_prefix(i, target, through_sequence=head_ - 1)
    await check(me, "copy_prefix target", await a.events.read(target))


async def truncate_prefix_keeping(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    await a.events.truncate_prefix_keeping(i, keep_from_sequence=1)
    await check(me, "truncate then read", await a.events.read(i))


async def schedule(a: Storage, me: str, i: str, t: int, check: CheckRead, audit: Audit) -> None:
    await a.timers.schedule(TimerRecord(i, wake(t, 59)))
    for record in await a.timers.pending(i):
        if record.wake_at - T0 < timedelta(minutes=t) or record.execution_id != i:
            audit.leak(f"{me!r} sees timer {record}")


async def due(a: Storage, me: str, i: str, t: int, check: CheckRead, audit: Audit) -> None:
    for record in await a.timers.due(T0 + timedelta(days=1), limit=rng_limit(i)):
        if not timedelta(minutes=t) <= record.wake_at - T0 < timedelta(minutes=t + 1):
            audit.leak(f"{me!r} got another tenant's due row {record}")


def rng_limit(execution_id: str) -> int:
    return 1 + len(execution_id) % 7


async def pending(a: Storage, me: str, i: str, t: int, check: CheckRead, audit: Audit) -> None:
    for record in await a.timers.pending(i):
        if not timedelta(minutes=t) <= record.wake_at - T0 < timedelta(minutes=t + 1):
            audit.leak(f"{me!r} got another tenant's pending row {record}")


async def complete(a: Storage, me: str, i: str, t: int, check: CheckRead, audit: Audit) -> None:
    # Complete a row at a time only the victim uses: it must not be there for us.
    for other in range(len(TENANTS)):
        if other != t and await a.timers.complete(i, wake(other, IDS.index(i) if i in IDS else 0)):
            audit.leak(f"{me!r} completed another tenant's timer of {i!r}")


async def cancel(a: Storage, me: str, i: str, t: int, check: CheckRead, audit: Audit) -> None:
    mine = len(await a.timers.pending(i))
    if await a.timers.cancel(i) != mine:
        audit.leak(f"{me!r} cancelled rows of {i!r} it could not see")
    await a.timers.schedule(TimerRecord(i, wake(t, IDS.index(i) if i in IDS else 0)))


async def lease_acquire(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    lease = await a.leases.acquire(i, f"holder:{me}", ttl_seconds=3600)
    if lease.key != i:
        audit.leak(f"{me!r} got lease key {lease.key!r} for {i!r}")


async def lease_renew(a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit) -> None:
    current = await a.leases.inspect(i)
    holder = current.holder if current is not None else f"holder:{me}"
    if holder != f"holder:{me}":
        audit.leak(f"{me!r} sees lease {i!r} held by {holder!r}")
        return
    if current is not None:
        await a.leases.renew(i, holder, ttl_seconds=3600)


async def lease_release(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    for other in TENANTS:
        if other != me and await a.leases.release(i, f"holder:{other}"):
            audit.leak(f"{me!r} released {other!r}'s lease {i!r}")


async def lease_inspect(
    a: Storage, me: str, i: str, _: int, check: CheckRead, audit: Audit
) -> None:
    lease = await a.leases.inspect(i)
    if lease is not None and (lease.holder != f"holder:{me}" or lease.key != i):
        audit.leak(f"{me!r} inspected {lease}")


METHODS: list[Attack] = [
    read, head, list_executions, subscribe, append, acquire_fence, acquire_fence_if,
    append_if_unchanged, append_many, delete_execution, copy_prefix, truncate_prefix_keeping,
    schedule, due, pending, complete, cancel, lease_acquire, lease_renew, lease_release,
    lease_inspect,
]
