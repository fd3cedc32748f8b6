"""Several nodes (separate connections or pools, as separate processes would have) appending
to one execution through their own audit decorators: every link is to the actual
predecessor."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from pathlib import Path

import pytest
from loom_audit import find_audit_store, read_link

from loom_core import ConflictError, NewEvent, Storage, open_storage

NODES = 3
WRITERS = 6
EVENTS_PER_WRITER = 8


@pytest.fixture(params=["sqlite"])
def node_opener(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, object]]:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'loom.db'}", {}
    database: str = request.getfixturevalue("stack_database")
    return database, {"schema": f"nodes_{uuid.uuid4().hex[:12]}"}


async def test_writers_on_separate_nodes_link_to_the_actual_predecessor(
    node_opener: tuple[str, dict[str, object]],
) -> None:
    url, options = node_opener
    nodes = [await open_storage(url, decorators=["audit"], options=options) for _ in range(NODES)]
    conflicts = 0

    async def writer(storage: Storage, name: str) -> None:
        nonlocal conflicts
        for i in range(EVENTS_PER_WRITER):
            while True:
                head = await storage.events.head("shared")
                try:
                    await storage.events.append(
                        "shared", [NewEvent("W", {"w": name, "i": i})], expected_sequence=head
                    )
                    break
                except ConflictError:  # a moved head, or a lost race to create the log
                    conflicts += 1
                    await asyncio.sleep(random.random() / 200)

    try:
        await asyncio.gather(*(writer(nodes[n % NODES], f"w{n}") for n in range(WRITERS)))
        audit = find_audit_store(nodes[0])
        rows = await audit.read_chained("shared")
        assert len(rows) == WRITERS * EVENTS_PER_WRITER
        for before, after in itertools.pairwise(rows):
            link_before, link_after = read_link(before.metadata), read_link(after.metadata)
            assert link_before is not None
            assert link_after is not None
            assert link_after.prev == link_before.hash
        assert (await audit.verify("shared")).ok
        assert (await find_audit_store(nodes[2]).verify("shared")).ok
    finally:
        for node in nodes:
            await node.close()
    assert conflicts > 0  # the nodes really raced
