"""Every relative link of README.md and docs/*.md leads somewhere: the file exists, and a
``#fragment`` names a heading of the Markdown file it points into (GitHub's anchors: the
heading lower-cased, punctuation dropped, spaces made hyphens, ``-1``, ``-2``... for a
repeated heading). Links inside code blocks are not links; absolute URLs are not checked.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

_HEADING: Final = re.compile(r"^#{1,6}\s+(?P<text>.*?)\s*#*\s*$")
_LINK: Final = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)\)")
_SCHEME: Final = re.compile(r"^[a-z][a-z0-9+.-]*:")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose(path):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match["text"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for number, line in _prose(path):
        for match in _LINK.finditer(line):
            target = match["target"]
            if _SCHEME.match(target):
                continue
            file_part, _, fragment = target.partition("#")
            destination = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not destination.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and destination.suffix == ".md" and fragment not in anchors(
                destination
            ):
                broken.append(f"{where} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(path: Path) -> None:
    assert broken_links(path) == []


def test_the_check_finds_a_broken_anchor_and_a_missing_file(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page's title\n\n## Twice\n\n## Twice\n\n"
        "[ok](#a-pages-title) [ok](#twice-1) [gone](#twice-2) [file](other.md)\n"
        "```\n[in code](#nowhere)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md:7: #twice-2 (no heading with that anchor)",
        "page.md:7: other.md (no such file)",
    ]
