"""What libpq sent and received on a connection: to count round trips in tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import pq

T = TypeVar("T")


def traced(conn: psycopg.Connection[Any], path: Path, work: Callable[[], T]) -> tuple[list[str], T]:
    """The messages libpq sent and received while ``work`` ran, one per line, and its result."""
    with path.open("w") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            result = work()
        finally:
            conn.pgconn.untrace()
    return path.read_text().splitlines(), result


def sent(lines: list[str]) -> list[str]:
    """The kinds of the messages the client sent (``Parse``, ``Sync``, ...), in order."""
    return [line.split("\t")[2] for line in lines if line.split("\t")[0] == "F"]
