"""Opening and closing again and again leaves nothing behind: after 500 opens and closes
of a storage, and 200 entries and exits of an app that ran an execution each time, this
process has no more file descriptors, threads or asyncio tasks than after the first few.
(The PostgreSQL counterpart, which counts the server's backends too, is in the plugin's
tests.)"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from pathlib import Path

import pytest
from loom_runtime import Context, Loom

from loom_core import NewEvent, open_storage


def held() -> tuple[int, int, int]:
    """File descriptors, threads and asyncio tasks this process holds now."""
    gc.collect()
    return (
        len(os.listdir("/proc/self/fd")),
        len(threading.enumerate()),
        len(asyncio.all_tasks()),
    )


def url_of(backend: str, tmp_path: Path) -> str:
    return "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'loom.db'}"


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_opening_and_closing_a_storage_500_times_leaves_nothing_behind(
    backend: str, tmp_path: Path
) -> None:
    url = url_of(backend, tmp_path)
    for _ in range(3):  # the first opens import and cache what every later one shares
        await (await open_storage(url)).close()
    before = held()
    for n in range(500):
        storage = await open_storage(url)
        await storage.events.append(f"e{n}", [NewEvent("A")], expected_sequence=0)
        await storage.close()
    assert held() == before


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_entering_and_leaving_an_app_200_times_leaves_nothing_behind(
    backend: str, tmp_path: Path
) -> None:
    url = url_of(backend, tmp_path)

    def app() -> Loom:
        built = Loom(url, node="n1")

        @built.workflow(name="one")
        async def one(ctx: Context) -> int:
            return 1

        return built

    for _ in range(3):
        async with app():
            pass
    before = held()
    for n in range(200):
        async with app() as entered:
            assert await entered.execute("one", id=f"e{n}") == 1
    assert held() == before
