"""A report table at the end of a test run, as the fault and cluster suites print theirs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest


def write_table(
    terminalreporter: pytest.TerminalReporter,
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
) -> None:
    """One section: the first column left-aligned, the others right-aligned."""
    cells = [[str(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    terminalreporter.section(title)
    for line in (list(headers), *cells):
        pairs = enumerate(zip(line, widths, strict=True))
        terminalreporter.write_line(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)
        )
