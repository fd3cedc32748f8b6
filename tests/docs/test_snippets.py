"""Every ```python block of README.md and docs/*.md runs, as written, in the test command.

The convention, for whoever writes a snippet:

* Each ```python block is one test, named by its file and line
  (``test_snippet_runs[docs/user-guide.md:137]``). It runs in its own namespace with a
  fresh temporary directory as the working directory. A snippet that raises fails its
  test; the traceback points into the Markdown file at the line that raised.
* Top-level ``await``, ``async with`` and ``async for`` are allowed: the block is compiled
  with ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and run in a new event loop. A block with no
  top-level ``await`` and no setup runs outside any loop, so it may call ``asyncio.run``.
* An HTML comment on the line before the block (blank lines between are allowed)
  configures it: ``<!-- snippet: KEY=VALUE ... -->``, values quoted like a shell's.

  - ``setup=NAME[,NAME]``: names the block uses without defining them, given by the
    fixtures in ``SETUPS`` below (an open memory storage, a parked execution, an SQLite
    storage, a key store...). ``setup=postgres`` replaces every ``"postgresql://..."`` or
    ``"postgres://..."`` string literal by the URL of a fresh database on a real server
    (``loom_conformance.postgres``: started by the tests, or ``LOOM_TEST_POSTGRES_URL``;
    under ``CI=true`` a missing server fails, never skips); distinct literals get
    distinct databases.
  - ``project=NAME file=PATH``: the block is the file PATH of a small project; the
    blocks of one project (python or not, e.g. a ``pyproject.toml``; several blocks with
    one PATH are joined in order) are written to a temporary directory, with the files
    ``PROJECT_BASE`` names, and the project's tests run with pytest in a subprocess,
    which must pass. A ``pyproject.toml`` there is installed as far as Loom needs it:
    its ``[project.entry-points.loom]`` become a distribution's entry points, so
    ``open_storage`` finds the plugin exactly as after ``pip install``. ``args="..."``
    adds pytest arguments; ``setup=postgres`` hands the project the server.

  - ``same-as=PATH`` (any language): the block is a copy of the repository's file PATH,
    and must stay one (the plugin guide's ``tox.ini``, which is then run itself).

* Every block of every file runs; a block cannot opt out.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from loom_conformance.postgres import PostgresServer, loom_postgres_server

from loom_core import NewEvent, open_storage

__all__ = ["loom_postgres_server"]

ROOT: Final = Path(__file__).resolve().parents[2]

DOCS: Final = ("README.md", *sorted(f"docs/{f.name}" for f in (ROOT / "docs").glob("*.md")))

# Files a project starts with that the guide points to instead of showing.
PROJECT_BASE: Final[dict[str, dict[str, str]]] = {
    "store": {
        "loom_example_store/store.py": "examples/loom-example-store/loom_example_store/store.py",
    },
}

_FENCE: Final = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
_MARKER: Final = re.compile(r"^\s*<!--\s*snippet:(?P<body>.*?)-->\s*$")
_KEYS: Final = frozenset({"setup", "project", "file", "args", "same-as"})
_PG_LITERAL: Final = re.compile(r"""(?P<q>["'])(?P<url>postgres(?:ql)?://[^"'\n]*)(?P=q)""")
# A project's run is bounded so a hang fails with its output (nothing asserts a duration).
_PROJECT_TIMEOUT: Final = 900


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block of a Markdown file and the options of its marker."""

    doc: str
    line: int  # of the opening fence, 1-based
    lang: str
    source: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def setups(self) -> tuple[str, ...]:
        value = self.options.get("setup", "")
        return tuple(name for name in value.split(",") if name)


def parse_marker(text: str, where: str) -> dict[str, str]:
    """The KEY=VALUE pairs of a ``<!-- snippet: ... -->`` comment; unknown keys refused."""
    options: dict[str, str] = {}
    for word in shlex.split(text):
        key, sep, value = word.partition("=")
        if not sep or key not in _KEYS:
            raise ValueError(f"{where}: snippet marker {word!r}: use one of {sorted(_KEYS)}")
        options[key] = value
    if ("project" in options) != ("file" in options):
        raise ValueError(f"{where}: a project block names both project= and file=")
    for name in options.get("setup", "").split(","):
        if name and name not in SETUPS:
            raise ValueError(f"{where}: unknown setup {name!r}; known: {sorted(SETUPS)}")
    return options


def blocks_of(doc: str, text: str) -> list[Block]:
    """Every fenced block of ``text``, with the marker that precedes it, if any."""
    lines = text.splitlines()
    found: list[Block] = []
    marker: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        match = _MARKER.match(lines[i])
        if match:
            marker = (i + 1, match["body"])
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if fence is None:
            if lines[i].strip():
                marker = None
            i += 1
            continue
        start, indent, body = i, len(fence["indent"]), []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        if i == len(lines):
            raise ValueError(f"{doc}:{start + 1}: a fenced block is never closed")
        options = parse_marker(marker[1], f"{doc}:{marker[0]}") if marker else {}
        found.append(Block(doc, start + 1, fence["lang"], "\n".join(body) + "\n", options))
        marker = None
        i += 1
    return found


def _all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks_of(doc, (ROOT / doc).read_text("utf-8"))]


# -- setups ------------------------------------------------------------------------------


@dataclass(slots=True)
class Context:
    """What a setup may use: the snippet's directory and, on demand, the server."""

    directory: Path
    postgres: Callable[[], PostgresServer]


Setup = Callable[[Context], AbstractAsyncContextManager[dict[str, object]]]


@contextlib.asynccontextmanager
async def _memory(ctx: Context) -> AsyncIterator[dict[str, object]]:
    async with open_storage("memory://") as storage:
        yield {"storage": storage, "events": storage.events}


@contextlib.asynccontextmanager
async def _park(ctx: Context) -> AsyncIterator[dict[str, object]]:
    """``execution_id`` parked at ``park_seq`` (written under the token of its driver)."""
    async with open_storage("memory://") as storage:
        events = storage.events
        token = await events.acquire_fence("order-42")
        await events.append(
            "order-42",
            [NewEvent("EXECUTION_STARTED"), NewEvent("EXECUTION_SUSPENDED", {"timer": "t1"})],
            expected_sequence=0, fence=token,
        )
        yield {"storage": storage, "events": events, "execution_id": "order-42", "park_seq": 1}


@contextlib.asynccontextmanager
async def _sqlite(ctx: Context) -> AsyncIterator[dict[str, object]]:
    """``storage`` on ``loom.db`` in the snippet's directory, beside an empty ``backups/``."""
    (ctx.directory / "backups").mkdir()
    async with open_storage("sqlite:///loom.db") as storage:
        yield {"storage": storage}


@contextlib.asynccontextmanager
async def _postgres(ctx: Context) -> AsyncIterator[dict[str, object]]:
    ctx.postgres()  # the literals are replaced before the block is compiled
    yield {}


_GRANTS: Final = (
    "CREATE ROLE {role} LOGIN PASSWORD {password} NOSUPERUSER NOBYPASSRLS",
    "GRANT USAGE ON SCHEMA loom TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA loom TO {role}",
    "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA loom TO {role}",
)


@contextlib.asynccontextmanager
async def _postgres_rls(ctx: Context) -> AsyncIterator[dict[str, object]]:
    """``owner_url``: a fresh database whose schema ``loom`` loom-postgres created;
    ``app_url``: a login role that does not own it, granted what docs/tenant.md says."""
    import psycopg
    from psycopg import sql

    owner_url = ctx.postgres().fresh_database("loom_docs")
    await (await open_storage(owner_url, options={"schema": "loom"})).close()
    role, password = f"loom_app_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        for statement in _GRANTS:
            await conn.execute(
                sql.SQL(statement).format(
                    role=sql.Identifier(role), password=sql.Literal(password)
                )
            )
    parts = owner_url.split("://", 1)[1].rsplit("@", 1)[-1]
    yield {"owner_url": owner_url, "app_url": f"postgresql://{role}:{password}@{parts}"}


@contextlib.asynccontextmanager
async def _crypto_keys(ctx: Context) -> AsyncIterator[dict[str, object]]:
    """``keys``: a FileKeyStore in the snippet's directory; ``subject_of``: every event
    belongs to ``customer-7``."""
    from loom_crypto import FileKeyStore

    def subject_of(execution_id: str, event: object) -> str | None:
        return "customer-7"

    yield {"keys": FileKeyStore(ctx.directory / "keys"), "subject_of": subject_of}


SETUPS: Final[dict[str, Setup]] = {
    "memory": _memory,
    "park": _park,
    "sqlite": _sqlite,
    "postgres": _postgres,
    "postgres-rls": _postgres_rls,
    "crypto-keys": _crypto_keys,
}


# -- running -----------------------------------------------------------------------------


def substitute_postgres(source: str, fresh: Callable[[], str]) -> str:
    """``source`` with each distinct PostgreSQL URL literal replaced by a fresh URL."""
    urls: dict[str, str] = {}

    def replace(match: re.Match[str]) -> str:
        url = match["url"]
        if url not in urls:
            urls[url] = fresh()
        return match["q"] + urls[url] + match["q"]

    return _PG_LITERAL.sub(replace, source)


def run_block(block: Block, ctx: Context) -> None:
    """Run ``block`` in ``ctx.directory`` (the caller's working directory)."""
    source = block.source
    if "postgres" in block.setups:
        source = substitute_postgres(source, lambda: ctx.postgres().fresh_database("loom_docs"))
    # Padded so the code's line numbers are the Markdown file's.
    code = compile(
        "\n" * block.line + source, str(ROOT / block.doc), "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True,
    )
    namespace: dict[str, object] = {"__name__": "__snippet__"}
    is_async = bool(code.co_flags & inspect.CO_COROUTINE)
    if not is_async and not block.setups:
        exec(code, namespace)
        return

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for name in block.setups:
                namespace.update(await stack.enter_async_context(SETUPS[name](ctx)))
            if is_async:
                await eval(code, namespace)
            else:
                exec(code, namespace)

    asyncio.run(main())


def _install_entry_points(project: Path, pyproject: str) -> None:
    """A ``.dist-info`` beside the project's code carrying its ``loom`` entry points, as
    ``pip install`` would leave it; found through ``PYTHONPATH``."""
    data = tomllib.loads(pyproject).get("project", {})
    groups: dict[str, dict[str, str]] = data.get("entry-points", {})
    name = str(data.get("name", f"snippet-project-{project.name}"))
    info = project / f"{name.replace('-', '_')}-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    lines = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
             for group, eps in groups.items()]
    (info / "entry_points.txt").write_text("\n".join(lines))


def run_project(
    files: dict[str, str], directory: Path, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Write ``files`` under ``directory`` and run pytest there in a new interpreter."""
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if "pyproject.toml" in files:
        _install_entry_points(directory, files["pyproject.toml"])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=directory, capture_output=True, text=True, timeout=_PROJECT_TIMEOUT,
        env={**os.environ, **env, "PYTHONPATH": str(directory), "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )


@dataclass(slots=True)
class Project:
    doc: str
    name: str
    blocks: list[Block]

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.blocks[0].line}[{self.name}]"

    def files(self) -> dict[str, str]:
        out = {rel: (ROOT / src).read_text("utf-8")
               for rel, src in PROJECT_BASE.get(self.name, {}).items()}
        for block in self.blocks:
            path = block.options["file"]
            out[path] = out[path] + "\n\n" + block.source if path in out else block.source
        return out

    def args(self) -> list[str]:
        return [a for b in self.blocks for a in shlex.split(b.options.get("args", ""))]

    def setups(self) -> set[str]:
        return {s for b in self.blocks for s in b.setups}


def _projects(blocks: list[Block]) -> list[Project]:
    found: dict[tuple[str, str], Project] = {}
    for block in blocks:
        if "project" in block.options:
            key = (block.doc, block.options["project"])
            found.setdefault(key, Project(block.doc, key[1], [])).blocks.append(block)
    return list(found.values())


BLOCKS: Final = _all_blocks()
SNIPPETS: Final = [b for b in BLOCKS if b.lang == "python" and "project" not in b.options]
PROJECTS: Final = _projects(BLOCKS)


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def context(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Context:
    monkeypatch.chdir(tmp_path)

    def server() -> PostgresServer:
        found: PostgresServer = request.getfixturevalue("loom_postgres_server")
        return found

    return Context(tmp_path, server)


# -- the docs ----------------------------------------------------------------------------


@pytest.mark.parametrize("block", SNIPPETS, ids=[b.where for b in SNIPPETS])
def test_snippet_runs(block: Block, context: Context) -> None:
    run_block(block, context)


@pytest.mark.parametrize("project", PROJECTS, ids=[p.where for p in PROJECTS])
def test_project_passes_its_tests(project: Project, context: Context) -> None:
    env: dict[str, str] = {}
    if "postgres" in project.setups():
        env["LOOM_TEST_POSTGRES_URL"] = context.postgres().url
    result = run_project(project.files(), context.directory, project.args(), env)
    assert result.returncode == 0, (
        f"{project.where}: pytest exited {result.returncode}\n{result.stdout[-6000:]}"
        f"\n{result.stderr[-3000:]}"
    )


COPIES: Final = [b for b in BLOCKS if "same-as" in b.options]


@pytest.mark.parametrize("block", COPIES, ids=[b.where for b in COPIES])
def test_block_is_a_copy_of_its_file(block: Block) -> None:
    path = block.options["same-as"]
    assert block.source == (ROOT / path).read_text("utf-8"), (
        f"{block.where} differs from {path}: change both"
    )


def test_the_example_tox_env_installs_loom_as_the_guide_says(tmp_path: Path) -> None:
    """The plugin guide's tox.ini (a copy of the example's, checked above), run as a
    third party runs it: a new virtualenv, Loom from the checkout, mypy, the kit (and
    none of the settings the project's own tox.ini gives its envs)."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUALENV_SETUPTOOLS"}
    result = subprocess.run(
        [sys.executable, "-m", "tox", "run", "--workdir", str(tmp_path / "tox")],
        cwd=ROOT / "examples" / "loom-example-store", capture_output=True, text=True,
        timeout=_PROJECT_TIMEOUT, check=False, env=env,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "Success: no issues found" in result.stdout


def test_every_python_block_of_the_covered_docs_is_run() -> None:
    python = [b for b in BLOCKS if b.lang == "python"]
    in_projects = [b for p in PROJECTS for b in p.blocks if b.lang == "python"]
    assert sorted(b.where for b in python) == sorted(
        [b.where for b in SNIPPETS] + [b.where for b in in_projects]
    )
    assert {"README.md", "docs/plugin-authors.md", "docs/user-guide.md"} <= {
        b.doc for b in python
    }


# -- the harness can fail ----------------------------------------------------------------


def _synthetic(text: str, tmp_path: Path) -> list[Block]:
    doc = tmp_path / "synthetic.md"
    doc.write_text(text)
    return [
        Block(str(doc), b.line, b.lang, b.source, b.options)
        for b in blocks_of("synthetic.md", text)
    ]


def test_a_snippet_that_raises_fails_naming_its_file_and_line(
    context: Context, tmp_path: Path
) -> None:
    text = "# t\n\n```python\nimport asyncio\nawait asyncio.sleep(0)\n1 / 0\n```\n"
    [block] = _synthetic(text, tmp_path)
    with pytest.raises(ZeroDivisionError) as info:
        run_block(block, context)
    last = info.traceback[-1]
    assert (Path(str(last.path)).name, last.lineno + 1) == ("synthetic.md", 6)


def test_a_name_no_setup_gives_is_a_name_error(context: Context, tmp_path: Path) -> None:
    [block] = _synthetic("```python\nawait events.head('x')\n```\n", tmp_path)
    with pytest.raises(NameError, match="events"):
        run_block(block, context)


def test_the_crypto_keys_setup_opens_crypto_above_audit(context: Context, tmp_path: Path) -> None:
    text = (
        "<!-- snippet: setup=crypto-keys -->\n```python\n"
        "from loom_core import NewEvent, open_storage\n"
        "crypto = ('crypto', {'key_store': keys, 'subject_of': subject_of})\n"
        "async with open_storage('sqlite:///loom.db', decorators=['audit', crypto]) as s:\n"
        "    await s.events.append('o', [NewEvent('STEP_COMPLETED', {'card': 1})],\n"
        "                          expected_sequence=0)\n"
        "    assert (await s.events.read('o'))[0].payload == {'card': 1}\n"
        "```\n"
    )
    [block] = _synthetic(text, tmp_path)
    run_block(block, context)
    assert (context.directory / "keys").is_dir()


def test_unknown_marker_keys_and_setups_are_refused() -> None:
    with pytest.raises(ValueError, match="use one of"):
        blocks_of("t.md", "<!-- snippet: skip=yes -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="unknown setup"):
        blocks_of("t.md", "<!-- snippet: setup=nowhere -->\n```python\npass\n```\n")


def test_a_marker_applies_to_the_next_block_only() -> None:
    blocks = blocks_of(
        "t.md", "<!-- snippet: setup=memory -->\n\n```python\npass\n```\ntext\n```python\n```\n"
    )
    assert [b.setups for b in blocks] == [("memory",), ()]


def test_a_project_whose_test_fails_fails(tmp_path: Path) -> None:
    result = run_project(
        {"tests/test_x.py": "def test_x():\n    assert 1 == 2\n"}, tmp_path, [], {}
    )
    assert result.returncode == 1
    assert "1 failed" in result.stdout


def test_a_project_pyproject_installs_its_loom_entry_points(tmp_path: Path) -> None:
    files = {
        "pyproject.toml": '[project.entry-points.loom]\nprobe = "probe_plugin"\n',
        "probe_plugin.py": (
            "from loom_core.spi import hookimpl\n\nasync def open_probe(url, options): ...\n\n"
            "@hookimpl\n"
            "def loom_register_backends(registry):\n"
            "    registry.add_backend('probe', open_probe)\n"
        ),
        "tests/test_probe.py": (
            "from loom_core.spi import PluginHost\n\n"
            "def test_found():\n"
            "    assert PluginHost().backend_for('probe') is not None\n"
        ),
    }
    result = run_project(files, tmp_path, [], {})
    assert result.returncode == 0, result.stdout + result.stderr


def test_postgres_literals_are_replaced_one_database_each() -> None:
    made = iter(["postgresql://a/1", "postgresql://a/2"])
    out = substitute_postgres(
        'x("postgresql://db0/loom", y=["postgres://db1/loom", "postgresql://db0/loom"])',
        lambda: next(made),
    )
    assert out == 'x("postgresql://a/1", y=["postgresql://a/2", "postgresql://a/1"])'
