"""How big a benchmark run is: full (``make bench``) or short (``make bench-short``, CI's).

The short form runs every suite on small sizes so that a suite that no longer works
fails CI; its figures are not judged and go to their own file. Every suite also runs
under a time limit, so a wait that never ends fails the run, naming the suite.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

SHORT = os.environ.get("INORDER_BENCH") == "short"
# The longest one suite may run (the full 100,000-row relay suite takes a few minutes).
SUITE_LIMIT_S = 300 if SHORT else 2400


def sized(full: T, short: T) -> T:
    """``full`` in a full run, ``short`` in the short one."""
    return short if SHORT else full
