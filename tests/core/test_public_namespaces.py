"""Every distribution in the repository uses only loom_core's public namespaces, and the
kernel never imports its own facades.

The public namespaces are :data:`PUBLIC`; a name is public when its namespace's ``__all__``
lists it. Everything else in ``loom_core`` (``validation``, ``registry``, ``protocols``,
``kinds``...) is private and may change, so the plugins, the runtime, the conformance kit,
the example store, the bench and the documentation's snippets must not import it: a third
party copies what our own distributions do. The kernel's own tests (``tests/core``) may.
"""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]

PUBLIC: Final = frozenset({
    "loom_core",
    "loom_core.spi",
    "loom_core.decorating",
    "loom_core.errors",
    "loom_core.memory",
})

FACADES: Final = frozenset({"loom_core", "loom_core.spi", "loom_core.decorating"})
"""What the kernel's own modules never import: each re-exports kernel modules, so a kernel
module importing one would be an import cycle waiting to happen."""

DISTRIBUTIONS: Final = ("plugins", "conformance", "examples", "bench", "runtime", "tests/docs")
DOCS: Final = ("README.md", "docs")

_FENCE: Final = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")


def _python_files(roots: Iterable[Path]) -> Iterator[Path]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).parts
            # Build and tox leftovers are copies, not sources.
            if any(p.startswith(".") or p == "build" or p.endswith(".egg-info") for p in parts):
                continue
            yield path


def _snippets(markdown: Path) -> Iterator[tuple[int, str]]:
    """(line of the opening fence, code) for each ```python block."""
    lines = markdown.read_text(encoding="utf-8").splitlines()
    start: int | None = None
    for number, line in enumerate(lines, start=1):
        fence = _FENCE.match(line)
        if fence is None:
            continue
        if start is None and fence["lang"] == "python":
            start = number
        elif start is not None and not fence["lang"]:
            yield start, textwrap.dedent("\n".join(lines[start:number - 1]))
            start = None


def _parse(code: str, where: str) -> ast.Module:
    # Documentation snippets may await at top level.
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(code, where, "exec", flags=flags, dont_inherit=True)
    assert isinstance(tree, ast.Module)
    return tree


def _loom_imports(tree: ast.Module) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) for every import of loom_core or below it; ``name`` is None
    for ``import loom_core.x``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "loom_core":
                    yield node.lineno, alias.name, None
        elif (
            isinstance(node, ast.ImportFrom) and node.level == 0
            and (node.module or "").split(".")[0] == "loom_core"
        ):
            for alias in node.names:
                yield node.lineno, str(node.module), alias.name


def _exported(module: str) -> frozenset[str]:
    names: list[str] = importlib.import_module(module).__all__
    submodules = {m.rpartition(".")[2] for m in PUBLIC if m.rpartition(".")[0] == module}
    return frozenset(names) | submodules


def private_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for each import that reaches past the public namespaces."""
    found = []
    for line, module, name in _loom_imports(tree):
        if module not in PUBLIC:
            shown = f"import {module}" if name is None else f"from {module} import {name}"
            found.append((line, f"{shown} ({module} is private)"))
        elif name is not None and name != "*" and name not in _exported(module):
            found.append((line, f"from {module} import {name} (not in {module}.__all__)"))
    return found


def distribution_violations(repo: Path) -> list[str]:
    """``file:line: what`` for each private import in the distributions and doc snippets."""
    found = []
    for path in _python_files(repo / d for d in DISTRIBUTIONS):
        where = path.relative_to(repo)
        tree = _parse(path.read_text(encoding="utf-8"), str(where))
        found += [f"{where}:{line}: {what}" for line, what in private_imports(tree)]
    for markdown in [repo / DOCS[0], *sorted((repo / DOCS[1]).glob("*.md"))]:
        where = markdown.relative_to(repo)
        for fence_line, code in _snippets(markdown):
            tree = _parse(code, str(where))
            # Line n of a snippet is line fence_line + n of its file.
            found += [
                f"{where}:{fence_line + line}: {what}" for line, what in private_imports(tree)
            ]
    return found


def _imports_a_facade(module: str, name: str | None) -> bool:
    if module == "loom_core" and name is not None:
        # ``from loom_core import kinds`` names a kernel module, which is fine; ``Storage``
        # is the facade's, and ``spi`` a facade itself.
        return name in _exported("loom_core") - {"errors", "memory"}
    return module in FACADES


def test_distributions_and_docs_import_only_the_public_namespaces() -> None:
    found = distribution_violations(ROOT)
    assert not found, "private loom_core imports outside the kernel:\n" + "\n".join(found)


def test_the_kernel_never_imports_its_own_facades() -> None:
    found = []
    for path in _python_files([ROOT / "loom_core"]):
        where = path.relative_to(ROOT)
        tree = _parse(path.read_text(encoding="utf-8"), str(where))
        found += [
            f"{where}:{line}: imports the facade {module}" + (f" ({name})" if name else "")
            for line, module, name in _loom_imports(tree)
            if _imports_a_facade(module, name)
        ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("from loom_core.validation import check_key", "x.py:1: from loom_core.validation"),
        ("import os\nimport loom_core.registry", "x.py:2: import loom_core.registry"),
        ("def f():\n    from loom_core.kinds import EventKind", "x.py:2: from loom_core.kinds"),
        ("from loom_core.memory.plugin import open_memory", "x.py:1: from loom_core.memory.plugin"),
        ("from loom_core import validation", "x.py:1: from loom_core import validation"),
        ("from loom_core import PluginHost", "x.py:1: from loom_core import PluginHost"),
        ("from loom_core.memory import plugin", "x.py:1: from loom_core.memory import plugin"),
    ],
)
def test_a_private_import_is_reported_at_its_line(code: str, expected: str) -> None:
    found = private_imports(_parse(code, "x.py"))
    assert len(found) == 1
    line, what = found[0]
    assert f"x.py:{line}: {what}".startswith(expected), found


@pytest.mark.parametrize(
    "code",
    [
        "from loom_core import Storage, open_storage\n",
        "from loom_core.spi import check_key, hookimpl\n",
        "from loom_core.decorating import FORWARD\n",
        "from loom_core.errors import StaleFenceError\n",
        "from loom_core.memory import MemoryEventStore, open_memory\n",
        "from loom_core import errors, spi\nimport loom_core.decorating\n",
        "from loom_conformance import suites\n",
    ],
)
def test_a_public_import_is_not_reported(code: str) -> None:
    assert private_imports(_parse(code, "x.py")) == []


def test_a_private_import_is_reported_by_file_and_line_in_code_and_snippets(
    tmp_path: Path,
) -> None:
    (tmp_path / "plugins" / "p").mkdir(parents=True)
    (tmp_path / "plugins" / "p" / "store.py").write_text(
        "from loom_core import Storage\nfrom loom_core.refusal import RefusesUnoffered\n",
        encoding="utf-8",
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Title\n\n```python\nimport asyncio\nfrom loom_core.registry import InnerOpener\n"
        "await asyncio.sleep(0)\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "docs" / "guide.md").write_text(
        "- a list\n\n  ```python\n  from loom_core import Storage\n  ```\n", encoding="utf-8"
    )
    assert distribution_violations(tmp_path) == [
        "plugins/p/store.py:2: from loom_core.refusal import RefusesUnoffered "
        "(loom_core.refusal is private)",
        "README.md:5: from loom_core.registry import InnerOpener (loom_core.registry is private)",
    ]


@pytest.mark.parametrize(
    ("code", "facade"),
    [
        ("from loom_core.spi import EventStore", True),
        ("from loom_core.decorating import FORWARD", True),
        ("from loom_core import Storage", True),
        ("from loom_core import spi", True),
        ("import loom_core", True),
        ("from loom_core.protocols import EventStore", False),
        ("from loom_core import kinds", False),
        ("from loom_core.errors import LoomError", False),
        ("from loom_core.memory import plugin", False),
    ],
)
def test_a_kernel_import_of_a_facade_is_recognised(code: str, facade: bool) -> None:
    ((_, module, name),) = _loom_imports(_parse(code, "x.py"))
    assert _imports_a_facade(module, name) is facade
