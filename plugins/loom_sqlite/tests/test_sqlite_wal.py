"""The ``-wal`` file behind a reader another process holds open.

A read transaction left open elsewhere (a ``sqlite3`` shell after ``BEGIN; SELECT ...``)
pins the frames its snapshot needs, so no checkpoint can start the ``-wal`` file over
while it stays open and the file grows with every commit. Once it ends, the store's own
checkpoints start the file over and cut it back to ``WAL_SIZE_LIMIT``. The reader here is
a connection the test holds open and closes itself: nothing is timed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from loom_sqlite.connection import WAL_SIZE_LIMIT
from loom_sqlite.transactions import CHECKPOINT_ROWS
from sqlite_helpers import url_for

from loom_core import NewEvent, Storage, open_storage

PAYLOAD = "x" * 16000  # four pages an event, so the -wal file grows fast


def _wal_size(db_path: Path) -> int:
    wal = db_path.with_name(db_path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


async def _append(storage: Storage, execution_id: str, sequence: int) -> None:
    await storage.events.append(
        execution_id, [NewEvent("noted", {"n": sequence, "pad": PAYLOAD})],
        expected_sequence=sequence,
    )


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_a_wal_grown_behind_a_long_reader_is_cut_back_once_the_reader_ends(
    db_path: Path, synchronous: str
) -> None:
    async with open_storage(url_for(db_path), options={"synchronous": synchronous}) as storage:
        await _append(storage, "grown", 0)
        reader = sqlite3.connect(db_path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            before = reader.execute("SELECT count(*) FROM loom_events").fetchone()[0]
            sequence = 1
            while _wal_size(db_path) <= WAL_SIZE_LIMIT + 1024 * 1024:
                await _append(storage, "grown", sequence)
                sequence += 1
            grown = _wal_size(db_path)
            # The reader's snapshot is intact however far the writers went.
            assert reader.execute("SELECT count(*) FROM loom_events").fetchone()[0] == before
            reader.execute("COMMIT")
        finally:
            reader.close()
        # Enough writes for the store to checkpoint at least twice, however they are split
        # between the loop and the thread; it stops at the first write that cut the file.
        for _ in range(3 * CHECKPOINT_ROWS):
            if _wal_size(db_path) <= WAL_SIZE_LIMIT:
                break
            await _append(storage, "grown", sequence)
            sequence += 1
        assert _wal_size(db_path) <= WAL_SIZE_LIMIT < grown
        assert await storage.events.head("grown") == sequence
