"""A clock of one process's own: its wall clock offset by what a file holds, moved by writing it.

The offset is applied to Python's ``time.time`` in the process (``clockshim``, loaded at
start-up); the monotonic clock is left alone, as a real clock jump leaves it. Writing
``+30d`` or ``-2h`` moves the process's clock within a second while every other process
keeps the machine's.
"""

from __future__ import annotations

import os
from pathlib import Path

SHIM = Path(__file__).parent / "clockshim"


def clock_env(offset_file: Path, python_path: str, offset: str = "+0") -> dict[str, str]:
    """The settings that put a process on the clock ``offset_file`` holds (written now).

    ``python_path``: the process's own, which the shim's folder goes in front of.
    """
    offset_file.write_text(f"{offset}\n")
    return {
        "INORDER_TEST_CLOCK_FILE": str(offset_file),
        "PYTHONPATH": os.pathsep.join(p for p in (str(SHIM), python_path) if p),
    }


def jump(offset_file: Path, offset: str) -> None:
    """Move the clock of every process on ``offset_file`` to ``offset`` from the machine's."""
    offset_file.write_text(f"{offset}\n")
