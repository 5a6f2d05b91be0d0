"""Every link between the project's pages leads somewhere: the file exists, and so does the
section it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.services import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
SKIP = {".venv", "node_modules", ".git", "__pycache__"}


def _pages() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def broken(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or section does not exist."""
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        where = page if not path else (page.parent / path).resolve()
        if not where.exists() or (
            anchor and where.suffix == ".md" and anchor not in _anchors(where)
        ):
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_somewhere(page: Path) -> None:
    """A page's relative links name files that exist and sections those files have."""
    assert broken(page) == []


def test_the_check_finds_a_dead_file_and_a_dead_section(tmp_path: Path) -> None:
    """A link to a missing page and one to a missing section are both reported."""
    (tmp_path / "b.md").write_text("# There\n\n## Is a section\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#is-a-section) [gone](c.md#x) [no](b.md#nowhere) [web](https://x.y/#z)\n"
    )
    assert broken(page) == ["c.md#x", "b.md#nowhere"]
