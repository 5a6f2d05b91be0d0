"""The heap a service starts with is kept out of the garbage collector's way."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from schemas.runtime.process import GC_THRESHOLDS, settle_heap

# Frees a 20 MB batch, then counts the page faults of making the next one.
BATCHES = """
import resource, sys
from schemas.runtime.process import keep_freed_heap
if sys.argv[1] == 'kept':
    assert keep_freed_heap()
size = 2000  # a variable: a constant product would be folded into one object
batch = [b'x' * size for _ in range(10_000)]
del batch
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
batch = [b'x' * size for _ in range(10_000)]
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", BATCHES, mode], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_objects_alive_at_start_are_frozen_and_young_collections_are_rarer(
    restored_gc: None,
) -> None:
    """Everything alive when serving starts is frozen; the young generation waits for 50,000."""
    alive_at_start = [object() for _ in range(100)]
    assert any(o is alive_at_start for o in gc.get_objects())
    settle_heap()
    assert not any(o is alive_at_start for o in gc.get_objects())  # no collection walks it
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] >= 50_000


def test_memory_freed_by_one_batch_serves_the_next_without_page_faults() -> None:
    """With the heap kept, a second 20 MB batch reuses the first's pages instead of faulting."""
    given_back, kept = _faults("default"), _faults("kept")
    assert given_back > 2_000  # about 5,000 pages of 4 KiB when malloc trims its heap
    assert kept < given_back / 10
