"""The heap a service starts with is kept out of the garbage collector's way."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from schemas.runtime.process import GC_THRESHOLDS, settle_heap


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
