"""How ``inorder-admin`` prints rows: a table on a terminal, TSV through a pipe, JSON lines on ask.

A table is sized to the terminal; piped into a file or a pager it would be cut to 80
columns, so there every value is printed in full, tab-separated under a header line.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table


def _cell(value: Any) -> str:
    """A value on one line (times in ISO 8601): tabs and newlines escaped, None empty."""
    if value is None:
        return ""
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


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
        lines = [f"# {title}"]
        if rows:
            lines.append("\t".join(rows[0]))
            lines.extend("\t".join(_cell(v) for v in row.values()) for row in rows)
        console.file.write("\n".join(lines) + "\n")
        return
    table = Table(title=title)
    for column in rows[0] if rows else ["(none)"]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_shown(v) for v in row.values()))
    console.print(table)


def _shown(value: Any) -> str:
    """A value for a person: times in UTC to the millisecond, on one line; None empty."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        utc = value.astimezone(UTC) if value.tzinfo else value
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    return str(value)
