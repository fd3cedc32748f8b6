"""The layout record, over real SQLite files: a sharded storage reopened in another layout
(a shard added, removed, renamed or reordered by position, ``colocate`` changed, one
database given twice) is refused at open, naming what changed, instead of looking for
existing executions on shards that do not hold them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from loom_sharded import (
    LAYOUT_ID,
    ShardedEventStore,
    ShardLayoutChangedError,
    ShardUnavailableError,
    check_layout,
    sharded_storage,
)

from loom_core import (
    ExecutionAlreadyExistsError,
    InvalidOptionError,
    NewEvent,
    Storage,
    open_storage,
)

IDS = [f"order-{n}/step" for n in range(40)]


def urls(tmp_path: Path, count: int) -> list[str]:
    return [f"sqlite:///{tmp_path / f'shard{i}.db'}" for i in range(count)]


async def open_sharded(
    shard_urls: Sequence[str], *, names: Sequence[str] | None = None,
    colocate: str | None = None,
) -> Storage:
    options: dict[str, object] = {"shards": list(shard_urls[1:])}
    if names is not None:
        options["names"] = list(names)
    if colocate is not None:
        options["colocate"] = colocate
    return await open_storage(shard_urls[0], decorators=[("sharded", options)])


async def write_ids(storage: Storage) -> None:
    for execution_id in IDS:
        await storage.events.append(execution_id, [NewEvent("A")], expected_sequence=0)


async def heads(shard_urls: Sequence[str]) -> list[tuple[str, ...]]:
    """What each shard holds, read bare, layout record included."""
    out = []
    for url in shard_urls:
        async with await open_storage(url) as bare:
            out.append(await bare.events.list_executions(limit=1000))
    return out


async def test_adding_a_shard_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    three = urls(tmp_path, 3)
    async with await open_sharded(three[:2]) as storage:
        await write_ids(storage)
    before = await heads(three)

    with pytest.raises(ShardLayoutChangedError, match=r"added \['shard-2'\]") as refused:
        await open_sharded(three)

    assert isinstance(refused.value, InvalidOptionError)
    assert refused.value.shard.index == 0
    assert "Changing the layout" in str(refused.value)
    assert await heads(three) == before
    async with await open_sharded(three[:2]) as storage:  # the recorded layout still opens
        assert await storage.events.list_executions(limit=1000) == tuple(sorted(IDS))


async def test_removing_a_shard_is_refused(tmp_path: Path) -> None:
    three = urls(tmp_path, 3)
    async with await open_sharded(three) as storage:
        await write_ids(storage)
    with pytest.raises(ShardLayoutChangedError, match=r"removed \['shard-2'\]"):
        await open_sharded(three[:2])
    with pytest.raises(ShardLayoutChangedError, match="default names are positions"):
        await open_sharded([three[0], three[2]])  # the middle one: shard-2 is now shard-1


async def test_reordering_default_named_shards_is_refused(tmp_path: Path) -> None:
    two = urls(tmp_path, 2)
    async with await open_sharded(two) as storage:
        await write_ids(storage)
    with pytest.raises(ShardLayoutChangedError, match="reordered") as refused:
        await open_sharded([two[1], two[0]])
    assert "shard-1" in str(refused.value)


async def test_reordering_named_shards_moves_nothing_and_opens(tmp_path: Path) -> None:
    three = urls(tmp_path, 3)
    async with await open_sharded(three, names=["a", "b", "c"]) as storage:
        await write_ids(storage)
    async with await open_sharded(
        [three[2], three[0], three[1]], names=["c", "a", "b"]
    ) as storage:
        for execution_id in IDS:
            assert await storage.events.head(execution_id) == 1
        assert await storage.events.list_executions(limit=1000) == tuple(sorted(IDS))


async def test_renaming_a_shard_is_refused(tmp_path: Path) -> None:
    two = urls(tmp_path, 2)
    async with await open_sharded(two, names=["a", "b"]) as storage:
        await write_ids(storage)
    with pytest.raises(ShardLayoutChangedError, match="'b'"):
        await open_sharded(two, names=["a", "bee"])


async def test_changing_colocate_is_refused(tmp_path: Path) -> None:
    two = urls(tmp_path, 2)
    async with await open_sharded(two) as storage:
        await write_ids(storage)
    with pytest.raises(ShardLayoutChangedError, match=r"colocate was None .* now '/'"):
        await open_sharded(two, colocate="/")


async def test_one_database_under_two_urls_is_refused_at_the_first_open(
    tmp_path: Path,
) -> None:
    first = f"sqlite:///{tmp_path / 'shard0.db'}"
    again = f"sqlite:///{tmp_path / 'x' / '..' / 'shard0.db'}"
    (tmp_path / "x").mkdir()
    with pytest.raises(ShardLayoutChangedError, match="one database is given as two shards"):
        await open_sharded([first, again])
    assert await heads([first]) == [()]  # the refusal took back the record it wrote
    second = f"sqlite:///{tmp_path / 'shard1.db'}"
    async with await open_sharded([first, second]):  # the layout corrected opens
        pass


async def test_the_record_is_not_an_execution(tmp_path: Path) -> None:
    three = urls(tmp_path, 3)
    async with await open_sharded(three) as storage:
        assert await storage.events.list_executions() == ()
        await write_ids(storage)
        for limit in (1, 2, 3, 7):
            seen: list[str] = []
            after: str | None = None
            while page := await storage.events.list_executions(after=after, limit=limit):
                assert len(page) == limit or len(seen) + len(page) == len(IDS)
                seen.extend(page)
                after = page[-1]
            assert seen == sorted(IDS)
    assert all(LAYOUT_ID in held for held in await heads(three))


async def test_a_first_open_stopped_part_way_is_completed(tmp_path: Path) -> None:
    two = urls(tmp_path, 2)
    async with await open_sharded(two) as storage:
        await write_ids(storage)
    async with await open_storage(two[1]) as bare:  # as if the first open died before it
        assert await bare.events.delete_execution(LAYOUT_ID)
    async with await open_sharded(two) as storage:
        assert await storage.events.list_executions(limit=1000) == tuple(sorted(IDS))
    assert all(LAYOUT_ID in held for held in await heads(two))


async def test_two_first_opens_of_one_layout_both_open(tmp_path: Path) -> None:
    two = urls(tmp_path, 2)
    one = await open_sharded(two)
    try:
        async with await open_sharded(two) as other:
            await other.events.append("x", [NewEvent("A")], expected_sequence=0)
        with pytest.raises(ExecutionAlreadyExistsError):
            await one.events.append("x", [NewEvent("A")], expected_sequence=0)
    finally:
        await one.close()


async def test_a_shard_down_at_open_leaves_the_others_serving_and_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    two = urls(tmp_path, 2)
    async with await open_sharded(two) as storage:
        await write_ids(storage)
    down = await open_storage(two[1])
    await down.close()
    with caplog.at_level(logging.WARNING, logger="loom_sharded"):
        storage = await open_storage(two[0], decorators=[("sharded", {"shards": [down]})])
    async with storage:
        assert "shard 1" in caplog.text
        assert isinstance(storage.events, ShardedEventStore)
        for execution_id in IDS:
            if storage.events.shard_of(execution_id) == 0:
                assert await storage.events.head(execution_id) == 1
            else:
                with pytest.raises(ShardUnavailableError, match="shard 1"):
                    await storage.events.head(execution_id)


async def test_every_shard_down_at_open_refuses_the_open(tmp_path: Path) -> None:
    shards = [await open_storage(url) for url in urls(tmp_path, 2)]
    for shard in shards:
        await shard.close()
    with pytest.raises(ShardUnavailableError, match="shard 0"):
        await check_layout(sharded_storage(shards))


async def test_an_added_shard_is_found_while_another_shard_is_down(tmp_path: Path) -> None:
    three = urls(tmp_path, 3)
    async with await open_sharded(three[:2]) as storage:
        await write_ids(storage)
    down = await open_storage(three[1])
    await down.close()
    added = await open_storage(three[2])
    with pytest.raises(ShardLayoutChangedError, match=r"added \['shard-2'\]"):
        await open_storage(three[0], decorators=[("sharded", {"shards": [down, added]})])
    await added.close()


async def test_sharded_storage_is_checked_by_check_layout(tmp_path: Path) -> None:
    two = urls(tmp_path, 2)
    async with await open_sharded(two) as storage:
        await write_ids(storage)
    shards = [await open_storage(url) for url in reversed(two)]
    storage = sharded_storage(shards)
    try:
        assert isinstance(storage.events, ShardedEventStore)
        with pytest.raises(ShardLayoutChangedError, match="reordered"):
            await check_layout(storage)
    finally:
        await storage.close()
    with pytest.raises(InvalidOptionError, match="sharded_storage"):
        await check_layout(shards[0])


async def test_a_shard_of_another_storage_with_the_same_names_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours, theirs = urls(tmp_path / "a", 2), urls(tmp_path / "b", 2)
    for pair in (ours, theirs):
        async with await open_sharded(pair) as storage:
            await write_ids(storage)
    with pytest.raises(ShardLayoutChangedError, match="another sharded storage") as refused:
        await open_sharded([ours[0], theirs[1]])
    assert refused.value.shard.index == 1


async def test_two_first_opens_at_once_agree_on_one_record(tmp_path: Path) -> None:
    """Whatever the interleaving, both opens succeed and every shard holds one record of
    one deployment: the first record written decides, and the other open reads it back."""
    three = urls(tmp_path, 3)
    first = sharded_storage([await open_storage(url) for url in three])
    second = sharded_storage([await open_storage(url) for url in three])
    try:
        await asyncio.gather(check_layout(first), check_layout(second))
        assert isinstance(first.events, ShardedEventStore)
        records = [await store.read(LAYOUT_ID) for store in first.events.wrapped]
        assert [len(r) for r in records] == [1, 1, 1]
        payloads = [r[0].payload for r in records]
        assert all(isinstance(p, dict) for p in payloads)
        assert len({p["deployment"] for p in payloads if isinstance(p, dict)}) == 1
    finally:
        await first.close()
        await second.close()


async def test_an_added_shard_is_found_while_every_recorded_shard_is_down(
    tmp_path: Path,
) -> None:
    """With no shard that answers holding a record, a reopen cannot be told from a first
    open: writing a fresh record would open a changed layout. Refused until one answers."""
    three = urls(tmp_path, 3)
    async with await open_sharded(three[:2]) as storage:
        await write_ids(storage)
    shards = [await open_storage(url) for url in three]
    for shard in shards[:2]:
        await shard.close()
    try:
        with pytest.raises(ShardUnavailableError, match="shard 0"):
            await check_layout(sharded_storage(shards))
        assert await shards[2].events.list_executions() == ()
    finally:
        await shards[2].close()
    async with await open_sharded(three[:2]) as storage:
        assert await storage.events.head(IDS[0]) == 1
    with pytest.raises(ShardLayoutChangedError, match=r"added \['shard-2'\]"):
        await open_sharded(three)
