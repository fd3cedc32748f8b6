"""The shell commands of README.md and docs/*.md name what exists: every directory a
``pip install`` of a checkout names is a distribution there (with the extras asked for),
every ``python -m`` module is importable, every ``tox run -e NAME`` is an env of tox.ini
and the README's table of envs is tox.ini's list; and the README's demos of the storage
kernel run as written. A directory, module or env renamed fails here until the docs say so.

Lines of ``performance-history.md`` and ``benchmarks.md`` are records of commands run at
a past commit, so they are left as they were written.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Final

import click
import pytest
from loom_runtime.cli import main

ROOT: Final = Path(__file__).resolve().parents[2]
_RECORDS: Final = frozenset({"docs/performance-history.md", "docs/benchmarks.md"})
DOCS: Final = tuple(
    doc
    for doc in ("README.md", *sorted(f"docs/{f.name}" for f in (ROOT / "docs").glob("*.md")))
    if doc not in _RECORDS
)
_SHELLS: Final = frozenset({"sh", "bash", "shell", "console"})
_FENCE: Final = re.compile(r"^\s*```(?P<lang>[\w+-]*)\s*$")
_INLINE: Final = re.compile(r"`(?P<code>[^`\n]+)`")
# A checkout cloned as ./loom (the plugin guide's layout) is this repository.
_CLONE: Final = re.compile(r"^\./loom(?=/|$)")


def _commands() -> list[tuple[str, str]]:
    """(where, command) for each line of a shell block and each inline code span that
    runs python or pip, line continuations joined and comments dropped."""
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text("utf-8").splitlines()
        lang: str | None = None
        pending = ""
        for number, line in enumerate(lines, 1):
            fence = _FENCE.match(line)
            if fence:
                lang = None if lang is not None else fence["lang"]
                continue
            if lang is None:
                for match in _INLINE.finditer(line):
                    code = match["code"]
                    if re.match(r"(python3?|pip|loom) ", code):
                        found.append((f"{doc}:{number}", code))
                continue
            if lang not in _SHELLS:
                continue
            text = pending + line.split(" #", 1)[0].rstrip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            for part in text.split("&&"):
                if part.strip() and not part.lstrip().startswith("#"):
                    found.append((f"{doc}:{number}", part.strip()))
    return found


COMMANDS: Final = _commands()


def _words(command: str) -> list[str]:
    return shlex.split(command)


def _installed_paths() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for where, command in COMMANDS:
        words = _words(command)
        if "pip" not in words or "install" not in words:
            continue
        for word in words[words.index("install") + 1:]:
            if word.startswith("."):
                out.append((where, word))
    return out


def _modules() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for where, command in COMMANDS:
        words = _words(command)
        if (
            len(words) > 2
            and words[0] in ("python", "python3")
            and words[1] == "-m"
            and words[2] not in ("pip", "tox", "asyncio")
        ):
            out.append((where, words[2]))
    return out


def _tox_envs_named() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for where, command in COMMANDS:
        words = _words(command)
        if "tox" in words and "-e" in words:
            name = words[words.index("-e") + 1]
            if name != "NAME":  # the README's placeholder
                out.append((where, name))
    return out


def _tox_envs() -> set[str]:
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    return {s.removeprefix("testenv:") for s in config.sections() if s.startswith("testenv:")}


@pytest.mark.parametrize(("where", "path"), _installed_paths())
def test_every_directory_pip_installs_is_a_distribution_with_its_extras(
    where: str, path: str
) -> None:
    match = re.fullmatch(r"(?P<dir>[^\[]+)(\[(?P<extras>[^\]]*)\])?", path)
    assert match, f"{where}: cannot read {path!r}"
    directory = ROOT / _CLONE.sub(".", match["dir"])
    pyproject = directory / "pyproject.toml"
    assert pyproject.is_file(), f"{where}: {path!r} is not a distribution of the checkout"
    project = tomllib.loads(pyproject.read_text("utf-8"))["project"]
    offered = set(project.get("optional-dependencies", {}))
    asked = {e for e in (match["extras"] or "").split(",") if e}
    assert asked <= offered, f"{where}: {path!r} asks for extras {sorted(asked - offered)}"


@pytest.mark.parametrize(("where", "module"), _modules())
def test_every_module_the_docs_run_with_python_m_is_runnable(
    where: str, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found as ``python -m`` finds it run from the checkout's root (``bench`` is a
    directory there), and a package has a ``__main__`` to run."""
    monkeypatch.syspath_prepend(str(ROOT))
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{where}: no module {module!r}"
    if spec.submodule_search_locations is not None:
        assert importlib.util.find_spec(f"{module}.__main__"), f"{where}: {module} has no __main__"


@pytest.mark.parametrize(("where", "env"), _tox_envs_named())
def test_every_tox_env_the_docs_name_is_in_tox_ini(where: str, env: str) -> None:
    assert env in _tox_envs(), f"{where}: tox.ini has no env {env!r}"


def test_the_readme_table_of_envs_is_tox_ini_s_list() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    table = readme.split("| env | what it runs |", 1)[1].split("\n\n", 1)[0]
    listed = {name for row in table.splitlines() for name in re.findall(r"^\| (.*?) \|", row)}
    names = {n for cell in listed for n in re.findall(r"`([\w-]+)`", cell)}
    assert names == _tox_envs()


def test_the_checks_find_the_commands_they_check() -> None:
    assert ("README.md:72", "python3 -m loom_core demo") in COMMANDS
    assert any(path == "./plugins/loom_sqlite" for _, path in _installed_paths())
    assert any(module == "loom_conformance.explorer" for _, module in _modules())
    assert any(env == "postgres" for _, env in _tox_envs_named())


_DEMOS: Final = [
    (where, command)
    for where, command in COMMANDS
    if where.startswith("README.md") and "loom_core demo" in command
    and "postgresql://" not in command  # needs a server the reader has
]


@pytest.mark.parametrize(("where", "command"), _DEMOS)
def test_the_readme_kernel_demos_run_as_written(
    where: str, command: str, tmp_path: Path
) -> None:
    words = _words(command)
    result = subprocess.run(
        [sys.executable, *words[1:]], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert result.returncode == 0, f"{where}: {command}\n{result.stdout}\n{result.stderr}"
    assert "EXECUTION_RESUMED" in result.stdout


def _loom_calls() -> list[tuple[str, list[str]]]:
    return [
        (where, _words(command)[1:])
        for where, command in COMMANDS
        if command.startswith("loom ")
    ]


@pytest.mark.parametrize(("where", "argv"), _loom_calls())
def test_every_loom_subcommand_and_option_the_docs_name_exists(
    where: str, argv: list[str]
) -> None:
    assert isinstance(main, click.Group)
    if argv[0].startswith("--"):
        assert argv[0] == "--help", f"{where}: loom has no option {argv[0]!r}"
        return
    command = main.commands.get(argv[0])
    assert command is not None, f"{where}: loom has no subcommand {argv[0]!r}"
    options = {o for p in command.params for o in p.opts} | {"--help"}
    unknown = [w for w in argv[1:] if w.startswith("--") and w not in options]
    assert not unknown, f"{where}: loom {argv[0]} has no option {unknown}"
