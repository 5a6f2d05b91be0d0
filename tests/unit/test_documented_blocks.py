"""Every code block a user would copy from the documentation is marked and run by a test."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.docs import DOCS, ROOT, examples

# A fence opening with a language: code to copy (plain fences hold output and diagrams).
_FENCE = re.compile(r"^(?P<before>.*)\n```(?P<language>[a-z]+)\n", re.MULTILINE)
_TESTS = ROOT / "tests"


def _test_sources() -> str:
    return "\n".join(p.read_text() for p in _TESTS.rglob("*.py") if p.name != Path(__file__).name)


def test_every_code_block_is_marked_as_an_example() -> None:
    """A block with a language tag has an example mark on the line before it."""
    unmarked = []
    for doc in DOCS:
        for match in _FENCE.finditer(doc.read_text()):
            if not match.group("before").startswith("<!-- example: "):
                unmarked.append(f"{doc.relative_to(ROOT)}: {match.group('before')[:60]!r}")
    assert not unmarked, unmarked


def test_every_marked_example_is_run_by_a_test() -> None:
    """Each example's name appears, quoted, in some test that takes the block by it."""
    sources = _test_sources()
    untested = [
        f"{doc.relative_to(ROOT)}: {name}"
        for doc in DOCS
        for name in examples(doc)
        if f'"{name}"' not in sources
    ]
    assert not untested, untested


def test_the_front_page_is_at_most_200_lines() -> None:
    """The front README stays a five-minute read; the rest lives beside the code."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
