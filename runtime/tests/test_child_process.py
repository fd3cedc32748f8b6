"""The test kit's child process: lines read in order, a real SIGKILL, a reaped exit code,
its stderr kept, and bad arguments refused before anything starts."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest
from loom_runtime.testing import ChildProcess

from loom_core import InvalidInputError, LoomError

# Says two lines and writes a note to stderr; then, given "wait", sleeps until it is killed.
TALKER = """
import sys, time
print("hello", flush=True)
print("world", flush=True)
sys.stderr.write("a note on stderr\\n"); sys.stderr.flush()
if sys.argv[1] == "wait":
    time.sleep(3600)
print("bye", flush=True)
"""


async def test_lines_come_in_order_and_the_end_of_output_is_none(tmp_path: Path) -> None:
    child = await ChildProcess.spawn(
        sys.executable, "-c", TALKER, "exit", stderr=tmp_path / "err"
    )
    assert [await child.line(), await child.line(), await child.line()] == [
        "hello",
        "world",
        "bye",
    ]
    assert await child.line() is None
    assert await child.finish() == 0
    assert child.returncode == 0
    assert not child.killed
    assert child.lines == ["hello", "world", "bye"]
    assert child.stderr_tail() == "a note on stderr"


async def test_a_killed_child_is_reaped_with_sigkill_and_keeps_what_it_said(
    tmp_path: Path,
) -> None:
    child = await ChildProcess.spawn(
        sys.executable, "-c", TALKER, "wait", stderr=str(tmp_path / "err")  # a str too
    )
    assert await child.line() == "hello"
    # Its stderr note is written after "world" is flushed: once it is there, so is "world".
    for _ in range(6000):
        if child.stderr_tail():
            break
        await asyncio.sleep(0.01)
    assert child.stderr_tail() == "a note on stderr"
    assert child.returncode is None
    child.kill()
    assert await child.finish() == -signal.SIGKILL
    assert child.killed
    assert child.lines == ["hello", "world"]  # the rest of stdout was read on finish
    child.kill()  # reaped already: a no-op, never an error


async def test_a_silent_child_times_out_and_can_still_be_killed(tmp_path: Path) -> None:
    child = await ChildProcess.spawn(
        sys.executable,
        "-c",
        "import time; time.sleep(3600)",
        stderr=tmp_path / "err",
        line_timeout=0.05,
    )
    try:
        # Says which child, and that line_timeout= is the bound (a bare TimeoutError
        # said neither).
        with pytest.raises(TimeoutError, match=rf"process {child.pid} .*line_timeout=0\.05"):
            await child.line()
    finally:
        child.kill()
    assert await child.finish() == -signal.SIGKILL
    assert child.stderr_tail() == ""


async def test_a_child_that_never_ends_times_out_in_finish_saying_what_to_do(
    tmp_path: Path,
) -> None:
    child = await ChildProcess.spawn(
        sys.executable, "-c", "import time; time.sleep(3600)", stderr=tmp_path / "err",
        line_timeout=0.05,
    )
    try:
        with pytest.raises(TimeoutError, match=r"kill\(\) it first"):
            await child.finish()
    finally:
        child.kill()
    assert await child.finish() == -signal.SIGKILL


@pytest.mark.parametrize(
    ("argv", "options", "names"),
    [
        ((), {}, "argv"),
        (("",), {}, "argv"),
        ((sys.executable, 3), {}, "argv"),
        ((sys.executable,), {"stderr": 3}, "stderr="),
        ((sys.executable,), {"stderr": ""}, "stderr="),
        ((sys.executable,), {"line_timeout": 0}, "line_timeout="),
        ((sys.executable,), {"line_timeout": float("inf")}, "line_timeout="),
        ((sys.executable,), {"line_timeout": True}, "line_timeout="),
        ((sys.executable, "-c", "pass\x00"), {}, "U+0000"),
        ((sys.executable,), {"env": {"A": 1}}, "env="),
        ((sys.executable,), {"env": {"A=B": "x"}}, "env="),
        ((sys.executable,), {"env": {"A": "x\x00"}}, "env="),
        ((sys.executable,), {"env": ["A"]}, "env="),
    ],
)
async def test_bad_arguments_are_refused_before_anything_starts(
    tmp_path: Path, argv: tuple[object, ...], options: dict[str, object], names: str
) -> None:
    arguments: dict[str, object] = {"stderr": tmp_path / "err", **options}
    with pytest.raises(InvalidInputError) as refused:
        await ChildProcess.spawn(*argv, **arguments)  # type: ignore[arg-type]
    assert isinstance(refused.value, LoomError)
    assert names in str(refused.value)
    assert not (tmp_path / "err").exists()  # nothing started, not even its stderr file
