"""A wall clock of one process's own, read from a file: run by Python at start-up.

A process started with this folder first on ``PYTHONPATH`` and ``INORDER_TEST_CLOCK_FILE``
set reads ``time.time()`` and ``time.time_ns()`` (structlog's timestamps, every time of day
the programs take) as the machine's clock plus the offset the file holds (``+30d``,
``-2h``, ``+50m``, ``+0``), read again at most once a second, so writing the file makes
the clock jump ahead or back while the process runs. The monotonic clock is left alone,
as a real clock jump leaves it; ``datetime.now`` reads the machine's (the consumer and the
sweeper never call it).

libfaketime does this below Python too, but a process with librdkafka in it stalls
under any offset (a produce and consume that takes 0.6 s at ``+0`` had not ended after
60 s at ``-3d`` or ``+30d``), so the offset is applied where the programs read the time.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse(text: str) -> float:
    """``+30d`` -> 2592000.0; a bare number is seconds."""
    text = text.strip()
    unit = _UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in _UNITS else text
    return float(number) * unit


def _install(path: str) -> None:
    real, real_ns, monotonic = time.time, time.time_ns, time.monotonic
    state = {"offset": 0.0, "read_at": float("-inf")}

    def offset() -> float:
        now = monotonic()
        if now - state["read_at"] >= 1.0:
            state["read_at"] = now
            with contextlib.suppress(OSError, ValueError):  # keep the last offset read
                state["offset"] = _parse(Path(path).read_text())
        return state["offset"]

    time.time = lambda: real() + offset()
    time.time_ns = lambda: real_ns() + int(offset() * 1_000_000_000)


_FILE = os.environ.get("INORDER_TEST_CLOCK_FILE")
if _FILE:
    _install(_FILE)
