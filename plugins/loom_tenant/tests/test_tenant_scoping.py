"""What one tenant sees and can touch through the decorated storage."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from loom_tenant import TenantDecorator, TenantEventStore, tenant_view
from loom_tenant.codec import TenantCodec

from loom_core import (
    AppendRequest,
    Event,
    EventStore,
    ExecutionAlreadyExistsError,
    InvalidExecutionIdError,
    InvalidOptionError,
    LeaseHeldError,
    LoomError,
    NewEvent,
    SequenceConflictError,
    StaleFenceError,
    Storage,
    StorageReadError,
    StoreClosedError,
    TimerRecord,
    Unsupported,
    open_storage,
)
from loom_core.decorating import FORWARD, Decisions, EventStoreDecorator
from loom_core.spi import OPTIONAL_EVENT_STORE_METHODS, OptionalMethod, PluginHost

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
async def shared() -> AsyncIterator[Storage]:
    async with open_storage("memory://") as storage:
        yield storage


async def _start(storage: Storage, execution_id: str, owner: str, count: int = 1) -> None:
    await storage.events.append(
        execution_id,
        [NewEvent("STEP_COMPLETED", {"owner": owner, "n": n}) for n in range(count)],
        expected_sequence=0,
    )


async def test_events_read_back_carry_the_tenants_own_id(shared: Storage) -> None:
    acme = tenant_view(shared, "acme")
    written = await acme.events.append("order-1", [NewEvent("A")], expected_sequence=0)
    assert [e.execution_id for e in written] == ["order-1"]
    assert [e.execution_id for e in await acme.events.read("order-1")] == ["order-1"]
    both = await acme.events.append_many(
        [AppendRequest("order-1", [NewEvent("B")], 1), AppendRequest("order-2", [NewEvent("C")], 0)]
    )
    assert [[e.execution_id for e in events] for events in both] == [["order-1"], ["order-2"]]
    again = await acme.events.append_if_unchanged(
        "order-2", [NewEvent("D")], expected_sequence=1, observed_fence=0
    )
    assert again[0].execution_id == "order-2"
    subscription = acme.events.subscribe("order-1")
    first = await anext(subscription)
    assert (first.execution_id, first.kind) == ("order-1", "A")


async def test_an_append_takes_ids_up_to_the_tenant_budget_and_refuses_the_rest(
    shared: Storage,
) -> None:
    # append encodes the common id inline; every id must get what codec.encode decides.
    acme = tenant_view(shared, "acme")
    budget = TenantCodec("acme").id_budget
    longest, accented = "i" * budget, "é" * (budget // 2)
    for execution_id in (longest, accented, "a b", "order/1"):
        (event,) = await acme.events.append(execution_id, [NewEvent("A")], expected_sequence=0)
        assert event.execution_id == execution_id
        assert await shared.events.head("4:acme/" + execution_id) == 1
    refused: list[tuple[object, str]] = [
        (longest + "i", "under tenant 'acme' the limit is"),
        ("é" * (budget // 2 + 1), "under tenant 'acme' the limit is"),
        ("", "must not be empty"),
        ("a\x00b", "control character"),
        ("a\tb", "control character"),
        (7, "must be a str"),
    ]
    before = await shared.events.list_executions()
    for bad, message in refused:
        with pytest.raises(InvalidExecutionIdError, match=message):
            await acme.events.append(bad, [NewEvent("A")], expected_sequence=0)  # type: ignore[arg-type]
    assert await shared.events.list_executions() == before


async def test_the_inner_store_holds_the_encoded_id_not_the_tenants(shared: Storage) -> None:
    await _start(tenant_view(shared, "acme"), "order-1", "acme")
    assert await shared.events.list_executions() == ("4:acme/order-1",)
    assert await shared.events.head("order-1") == 0


async def test_the_same_id_in_two_tenants_is_two_independent_logs(shared: Storage) -> None:
    acme, zeta = tenant_view(shared, "acme"), tenant_view(shared, "zeta")
    await _start(acme, "order-1", "acme", count=3)
    await _start(zeta, "order-1", "zeta", count=1)
    assert [e.payload for e in await zeta.events.read("order-1")] == [{"owner": "zeta", "n": 0}]
    assert await acme.events.head("order-1") == 3
    token = await acme.events.acquire_fence("order-1")
    assert token == 1
    # zeta's log is unfenced: its token-0 append is still accepted.
    await zeta.events.append("order-1", [NewEvent("X")], expected_sequence=1, fence=0)
    with pytest.raises(StaleFenceError):
        await acme.events.append("order-1", [NewEvent("X")], expected_sequence=3, fence=0)


async def test_errors_name_the_tenants_own_id(shared: Storage) -> None:
    acme = tenant_view(shared, "acme")
    await _start(acme, "order-1", "acme")
    with pytest.raises(SequenceConflictError) as conflict:
        await acme.events.append("order-1", [NewEvent("A")], expected_sequence=5)
    assert conflict.value.execution_id == "order-1"
    assert "acme/" not in str(conflict.value)
    assert "'order-1'" in str(conflict.value)
    with pytest.raises(ExecutionAlreadyExistsError) as exists:
        await acme.events.append("order-1", [NewEvent("A")], expected_sequence=0)
    assert exists.value.execution_id == "order-1"
    await acme.events.acquire_fence("order-1")
    with pytest.raises(StaleFenceError) as stale:
        await acme.events.append("order-1", [NewEvent("A")], expected_sequence=1, fence=0)
    assert (stale.value.execution_id, stale.value.current_fence) == ("order-1", 1)
    with pytest.raises(Exception, match="'order-1'") as past:
        await acme.events.copy_prefix("order-1", "copy", through_sequence=9)
    assert "4:acme" not in str(past.value)


async def test_list_executions_pages_in_code_point_order_of_the_tenants_ids(
    shared: Storage,
) -> None:
    # Tenants whose names and ids are built to interleave with "a"'s if the encoding
    # were naive: names that extend "a", and ids that spell another tenant's prefix.
    ids = ["b", "a", "a/", "1:a/x", "é", "🙂", "Z", "a:", "/", "0", "10", "2", "a" * 300]
    for tenant in ["a", "a/", "", "1:a/", "ab", "0:"]:
        view = tenant_view(shared, tenant)
        for execution_id in ids:
            await _start(view, execution_id, tenant)
    view = tenant_view(shared, "a")
    pages: list[tuple[str, ...]] = []
    after: str | None = None
    while True:
        page = await view.events.list_executions(after=after, limit=4)
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert [i for page in pages for i in page] == sorted(ids)
    assert [len(p) for p in pages] == [4, 4, 4, 1]
    later = [i for i in sorted(ids) if i > "a:"]
    assert await view.events.list_executions(after="a:", limit=2) == tuple(later[:2])


@pytest.mark.parametrize("tail", ["zz", "\u00e9\u00e9", "\u4e00\u4e00", "\U0001f600x"])
@pytest.mark.parametrize("short", [0, 1, 2, 3])
async def test_an_after_longer_than_the_tenant_budget_is_a_position_like_any_other(
    shared: Storage, tail: str, short: int
) -> None:
    """``after`` is a position, not an id to store: up to the store's 512 bytes it is
    accepted as on a bare store, and the page holds exactly the ids above it, though the
    tenant's own ids are shorter."""
    view = tenant_view(shared, "acme")
    budget = TenantCodec("acme").id_budget
    base = "a" * (budget - short)
    after = base + tail  # longer than the budget by 1 to 4 + len(tail) bytes
    near = [base + c for c in ("}", "~", "\x7e}", "\u07ff", "\uffff", "\u00e9", "\u4e00")]
    ids = sorted({i for i in [*near, "a", "b", base, base[:-1] + "b"] if len(i.encode()) <= budget})
    for execution_id in ids:
        await _start(view, execution_id, "acme")
    alone = await open_storage("memory://")
    for execution_id in ids:
        await _start(alone, execution_id, "acme")
    expected = await alone.events.list_executions(after=after, limit=1000)
    await alone.close()
    assert expected == tuple(i for i in ids if i > after)
    assert await view.events.list_executions(after=after, limit=1000) == expected
    assert await view.events.list_executions(after=after, limit=1) == expected[:1]


async def test_an_empty_tenant_name_is_a_tenant_of_its_own(shared: Storage) -> None:
    empty, other = tenant_view(shared, ""), tenant_view(shared, "0")
    await _start(empty, "x", "")
    await _start(other, "x", "0")
    assert await empty.events.list_executions() == ("x",)
    assert [e.payload for e in await empty.events.read("x")] == [{"owner": "", "n": 0}]


async def test_subscribe_sees_only_the_tenants_log_live(shared: Storage) -> None:
    acme, zeta = tenant_view(shared, "acme"), tenant_view(shared, "zeta")
    await _start(acme, "order-1", "acme")
    subscription = acme.events.subscribe("order-1", from_sequence=0)
    assert (await anext(subscription)).payload == {"owner": "acme", "n": 0}
    waiting = asyncio.ensure_future(anext(subscription))
    await _start(zeta, "order-1", "zeta", count=2)  # same id, other tenant
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await acme.events.append("order-1", [NewEvent("LIVE", {"owner": "acme"})], expected_sequence=1)
    live = await asyncio.wait_for(waiting, 10)
    assert (live.execution_id, live.kind, live.sequence) == ("order-1", "LIVE", 1)


async def test_copy_prefix_and_delete_stay_inside_the_tenant(shared: Storage) -> None:
    acme, zeta = tenant_view(shared, "acme"), tenant_view(shared, "zeta")
    await _start(acme, "src", "acme", count=3)
    await _start(zeta, "src", "zeta", count=2)
    await _start(zeta, "dst", "zeta")
    assert await acme.events.copy_prefix("src", "dst", through_sequence=1) == 2
    assert [e.payload for e in await zeta.events.read("dst")] == [{"owner": "zeta", "n": 0}]
    assert await acme.events.delete_execution("src")
    assert await zeta.events.head("src") == 2
    assert await acme.events.truncate_prefix_keeping("dst", keep_from_sequence=1) == 1
    assert await zeta.events.head("dst") == 1


async def test_timers_due_pending_and_cancel_see_only_the_tenants_rows(shared: Storage) -> None:
    acme, zeta = tenant_view(shared, "acme"), tenant_view(shared, "zeta")
    # zeta's rows are due first and outnumber acme's limit, so a naive filter after the
    # inner limit would return nothing for acme.
    for i in range(10):
        await zeta.timers.schedule(TimerRecord(f"z{i}", T0 + timedelta(seconds=i)))
        await zeta.timers.schedule(TimerRecord("shared-id", T0 + timedelta(seconds=i)))
    for i in range(3):
        await acme.timers.schedule(TimerRecord(f"a{i}", T0 + timedelta(minutes=1, seconds=i)))
    await acme.timers.schedule(TimerRecord("shared-id", T0 + timedelta(hours=1)))
    due = await acme.timers.due(T0 + timedelta(days=1), limit=3)
    assert [r.execution_id for r in due] == ["a0", "a1", "a2"]
    assert [r.execution_id for r in await acme.timers.due(T0 + timedelta(days=1), limit=50)] == [
        "a0", "a1", "a2", "shared-id"
    ]
    assert await acme.timers.pending("shared-id") == (
        TimerRecord("shared-id", T0 + timedelta(hours=1)),
    )
    assert await acme.timers.cancel("shared-id") == 1
    assert len(await zeta.timers.pending("shared-id")) == 10
    assert not await acme.timers.complete("z0", T0)
    assert await zeta.timers.complete("z0", T0)


async def test_leases_of_the_same_key_in_two_tenants_are_independent(shared: Storage) -> None:
    acme, zeta = tenant_view(shared, "acme"), tenant_view(shared, "zeta")
    lease = await acme.leases.acquire("order-1", "node-a", ttl_seconds=30)
    assert (lease.key, lease.holder) == ("order-1", "node-a")
    assert await zeta.leases.inspect("order-1") is None
    await zeta.leases.acquire("order-1", "node-z", ttl_seconds=30)
    with pytest.raises(LeaseHeldError) as held:
        await acme.leases.acquire("order-1", "node-x", ttl_seconds=30)
    assert (held.value.key, held.value.holder) == ("order-1", "node-a")
    assert not await zeta.leases.release("order-1", "node-a")
    assert acme.leases.scope == "process"


async def _call(storage: Storage, method: str) -> None:
    result = getattr(storage.events, method)("x", "y")
    if not isinstance(result, AsyncIterator):
        await result


@pytest.mark.parametrize("offered", [(), *((m,) for m in OPTIONAL_EVENT_STORE_METHODS)])
async def test_an_optional_method_is_offered_exactly_when_the_inner_store_offers_it(
    offered: tuple[OptionalMethod, ...],
) -> None:
    async with open_storage(
        "memory://", options={"offer": offered}, decorators=[("tenant", {"tenant": "t"})]
    ) as storage:
        assert storage.events.capabilities == frozenset(offered)
        for method in set(OPTIONAL_EVENT_STORE_METHODS) - set(offered):
            with pytest.raises(Unsupported, match=method):
                await _call(storage, method)


async def test_the_entry_point_registers_the_tenant_decorator() -> None:
    host = PluginHost()
    assert host.decorator("tenant").name == "tenant"
    assert host.decorators.source_of("tenant") == "loom-tenant"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs the option 'tenant'"),
        ({"tenant": 3}, "must be a str"),
        ({"tenant": "a\x00b"}, "control character"),
        ({"tenant": "a", "tennant": "b"}, "unknown tenant option"),
        ({"tenant": "x" * 129}, "the limit is 128"),
    ],
)
async def test_bad_options_are_refused_with_a_typed_error(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        await open_storage("memory://", decorators=[("tenant", options)])


async def test_a_decorated_storage_closes_its_inner_but_a_view_does_not() -> None:
    inner = await open_storage("memory://")
    view = tenant_view(inner, "acme")
    await view.close()
    assert not inner.closed
    decorated = await TenantDecorator().decorate(inner, {"tenant": "acme"})
    await decorated.close()
    assert inner.closed


async def test_the_kit_tenant_is_a_hostile_name_that_works() -> None:
    options = await TenantDecorator().conformance_options(lambda: open_storage("memory://"))
    store = TenantEventStore((await open_storage("memory://")).events, str(options["tenant"]))
    await store.append("x", [NewEvent("A")], expected_sequence=0)
    assert await store.list_executions() == ("x",)


async def test_a_closed_view_refuses_every_call_while_the_shared_storage_serves_others(
    shared: Storage,
) -> None:
    acme, other = tenant_view(shared, "acme"), tenant_view(shared, "other")
    await _start(acme, "e", "acme")
    await acme.close()
    await acme.close()  # twice is harmless
    wake = T0 + timedelta(minutes=1)
    calls: dict[str, Callable[[], object]] = {
        "append": lambda: acme.events.append("e", [NewEvent("A")], expected_sequence=1),
        "read": lambda: acme.events.read("e"),
        "head": lambda: acme.events.head("e"),
        "list_executions": lambda: acme.events.list_executions(),
        "acquire_fence": lambda: acme.events.acquire_fence("e"),
        "acquire_fence_if": lambda: acme.events.acquire_fence_if("e", fence=0, park_seq=0),
        "append_if_unchanged": lambda: acme.events.append_if_unchanged(
            "e", [NewEvent("A")], expected_sequence=1, observed_fence=0
        ),
        "append_many": lambda: acme.events.append_many([AppendRequest("e", [NewEvent("A")], 1)]),
        "delete_execution": lambda: acme.events.delete_execution("e"),
        "copy_prefix": lambda: acme.events.copy_prefix("e", "f", through_sequence=0),
        "truncate_prefix_keeping": lambda: acme.events.truncate_prefix_keeping(
            "e", keep_from_sequence=0
        ),
        "subscribe": lambda: acme.events.subscribe("e"),
        "schedule": lambda: acme.timers.schedule(TimerRecord("e", wake)),
        "due": lambda: acme.timers.due(wake),
        "pending": lambda: acme.timers.pending("e"),
        "complete": lambda: acme.timers.complete("e", wake),
        "cancel": lambda: acme.timers.cancel("e"),
        "lease acquire": lambda: acme.leases.acquire("k", "h", ttl_seconds=5),
        "lease renew": lambda: acme.leases.renew("k", "h", ttl_seconds=5),
        "lease release": lambda: acme.leases.release("k", "h"),
        "lease inspect": lambda: acme.leases.inspect("k"),
    }
    escaped: list[str] = []
    for name, call in calls.items():
        try:
            outcome = call()
            if inspect.isawaitable(outcome):
                await outcome
        except StoreClosedError:
            continue
        except LoomError as exc:
            escaped.append(f"{name}: {exc!r}")
            continue
        escaped.append(name)
    assert escaped == []
    assert not shared.closed
    await _start(other, "e", "other")  # the shared storage still serves the other tenant
    assert await shared.events.head(TenantCodec("acme").encode("e")) == 1


class _Misaddressing(EventStoreDecorator):
    """Broken on purpose: answers every append and read with the events of ``other``."""

    def __init__(self, inner: EventStore, other: str) -> None:
        super().__init__(inner)
        self.other = other

    async def append(
        self,
        execution_id: str,
        events: Sequence[NewEvent],
        *,
        expected_sequence: int,
        fence: int | None = None,
    ) -> tuple[Event, ...]:
        await self.inner.append(
            execution_id, events, expected_sequence=expected_sequence, fence=fence
        )
        return await self.inner.read(self.other)

    async def read(
        self,
        execution_id: str,
        *,
        from_sequence: int = 0,
        to_sequence: int | None = None,
        limit: int | None = None,
    ) -> tuple[Event, ...]:
        return await self.inner.read(self.other)

    decisions = Decisions(
        acquire_fence=FORWARD,
        acquire_fence_if=FORWARD,
        append_if_unchanged=FORWARD,
        append_many=FORWARD,
        delete_execution=FORWARD,
        copy_prefix=FORWARD,
        truncate_prefix_keeping=FORWARD,
        subscribe=FORWARD,
    )


@pytest.mark.parametrize("count", [1, 2], ids=["one event", "two events"])
async def test_an_inner_store_answering_with_another_executions_events_is_refused(
    shared: Storage, count: int
) -> None:
    other = TenantCodec("b").encode("x")
    await shared.events.append(
        other, [NewEvent("note", {"n": n}) for n in range(count)], expected_sequence=0
    )
    view = TenantEventStore(_Misaddressing(shared.events, other), "a", owns_inner=False)
    batch = [NewEvent("note", {"n": n}) for n in range(count)]
    with pytest.raises(StorageReadError, match="another execution"):
        await view.append("x", batch, expected_sequence=0)
    with pytest.raises(StorageReadError, match="another execution"):
        await view.read("x")
