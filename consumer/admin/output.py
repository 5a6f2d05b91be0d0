"""How ``inorder-admin`` prints rows: a table on a terminal, TSV through a pipe, JSON lines on ask.

A table is sized to the terminal; piped into a file or a pager it would be cut to 80
columns, so there every value is printed in full, tab-separated under a header line.

What a row holds was often written by a producer (a letter's detail, a trace id, an
entity id): it is printed as text, never read as rich's markup, and its control
characters are shown escaped, so no value can restyle, hide or rewrite what the
operator's terminal shows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

# C0 and C1 controls and DEL (a terminal's escape sequences start with one), and the
# marks that reorder what follows them on screen.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or f"\\u{ord(char):04x}"


def plain(text: str) -> str:
    """``text`` on one line with every control character shown escaped (``\\n``, ``\\u001b``)."""
    return _CONTROL.sub(_escaped, text.replace("\\", "\\\\"))


def _cell(value: Any) -> str:
    """A value on one line (times in ISO 8601), control characters escaped, None empty."""
    if value is None:
        return ""
    return plain(value.isoformat() if isinstance(value, datetime) else str(value))


def json_line(value: Any) -> str:
    """``value`` as one line of JSON: any key becomes a string, any other value its text."""
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode() + "\n"


def show(console: Console, title: str, rows: Sequence[dict[str, Any]], as_json: bool) -> None:
    """Print ``rows`` under ``title`` in the form that fits where the output goes."""
    if as_json:
        for row in rows:  # one compact object per line
            console.file.write(json_line(row))
        return
    if not console.is_terminal:
        lines = [f"# {plain(title)}"]
        if rows:
            lines.append("\t".join(plain(str(name)) for name in rows[0]))
            lines.extend("\t".join(_cell(v) for v in row.values()) for row in rows)
        console.file.write("\n".join(lines) + "\n")
        return
    table = Table(title=Text(plain(title)))
    for column in rows[0] if rows else ["(none)"]:
        table.add_column(Text(plain(str(column))))
    for row in rows:
        table.add_row(*(Text(_shown(v)) for v in row.values()))
    console.print(table)


def _shown(value: Any) -> str:
    """A value for a person: times in UTC to the millisecond, on one line; None empty."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        utc = value.astimezone(UTC) if value.tzinfo else value
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    return plain(str(value))
