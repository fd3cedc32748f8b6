"""A writer process SIGKILLed at random points, 200 times, loses nothing it acknowledged.

Each round forks a fresh writer process (from a warm ``sqlite_worker.py zygote``, so a round costs
milliseconds, not an interpreter start-up). The writer appends batches of 1-3 events to
three executions concurrently (so its appends share group commits) and pairs of
executions through ``append_many``, printing an ``ack`` line after each append returns.
The test kills it with SIGKILL after a random number of acks plus a random few
milliseconds, so kills land before the storage is open, mid-transaction, mid-commit and
between appends. After every kill: each acknowledged event is present, each log is gapless
from 0 with no duplicate, every append is whole (a batch is all there or not at all), the
two ``append_many`` executions moved together, and ``PRAGMA integrity_check`` is ok.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
from pathlib import Path

from sqlite_helpers import expect_line, send, spawn, url_for

KILLS = 200
PAIR = ("durable-m-l", "durable-m-r")


def _check(path: Path, acked: dict[str, int]) -> dict[str, int]:
    """Check the file after a kill; returns each execution's head."""
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        heads = dict(raw.execute(
            "SELECT id, max("
            "coalesce((SELECT floor FROM loom_logs WHERE execution_id = id), 0), "
            "coalesce((SELECT max(sequence) + 1 FROM loom_events WHERE execution_id = id), 0)"
            ") FROM (SELECT execution_id AS id FROM loom_events "
            "UNION SELECT execution_id FROM loom_logs)"
        ).fetchall())
        for execution_id, head in heads.items():
            rows = raw.execute(
                "SELECT sequence, json_extract(payload, '$.n'), json_extract(payload, '$.of') "
                "FROM loom_events WHERE execution_id = ? ORDER BY sequence",
                (execution_id,),
            ).fetchall()
            assert [r[0] for r in rows] == list(range(head)), f"{execution_id}: gap or extra"
            assert all(r[1] == r[0] for r in rows), f"{execution_id}: events out of place"
            position = 0
            while position < head:  # each append's events are all there, in one run
                size = rows[position][2]
                assert position + size <= head, f"{execution_id}: half an append at {position}"
                assert all(r[2] == size for r in rows[position : position + size])
                position += size
        for execution_id, acked_head in acked.items():
            assert heads.get(execution_id, 0) >= acked_head, f"{execution_id}: lost an ack"
        assert heads.get(PAIR[0], 0) == heads.get(PAIR[1], 0), "append_many was split"
        return heads
    finally:
        raw.close()


def test_acknowledged_appends_survive_200_sigkills(db_path: Path) -> None:
    rng = random.Random(0x5EED)
    zygote = spawn("zygote", url_for(db_path))
    acked: dict[str, int] = {}
    heads: dict[str, int] = {}
    try:
        expect_line(zygote, "ready")
        for round_ in range(KILLS):
            send(zygote, f"go {round_}")
            pid = int(expect_line(zygote).removeprefix("pid "))
            wanted = rng.choice((0, 1, 2, 3, 5, 8, 13))
            seen = 0
            while seen < wanted:
                line = expect_line(zygote)
                assert line.startswith("ack "), f"writer stopped on its own: {line!r}"
                _, execution_id, start, count = line.split()
                acked[execution_id] = max(acked.get(execution_id, 0), int(start) + int(count))
                seen += 1
            time.sleep(rng.random() * 0.004)
            os.kill(pid, signal.SIGKILL)
            while (line := expect_line(zygote)) != f"dead {pid}":
                _, execution_id, start, count = line.split()
                acked[execution_id] = max(acked.get(execution_id, 0), int(start) + int(count))
            heads = _check(db_path, acked)
    finally:
        if zygote.poll() is None:
            zygote.kill()
        zygote.wait()
    assert sum(heads.values()) >= sum(acked.values()) > 0
