"""The sweeper's pure decisions: which seqs an entity waits for, and when a gap has healed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumer.kinds.steps.gaps import Gap, healed, missing_range
from consumer.kinds.steps.plan import Progress
from schemas import Event


def _parked(seq: int, generation: int = 1) -> Event:
    return Event("e", "l.x", "l", "a", generation, seq, "t", "t", {})


@pytest.mark.parametrize(
    ("progress", "first_parked", "expected"),
    [
        (Progress(1, 6), _parked(8), (1, 7, 7)),
        (Progress(1, 6), _parked(12), (1, 7, 11)),
        (Progress(1, 0), _parked(3), (1, 1, 2)),
        (Progress(1, 9), _parked(4, generation=2), (2, 1, 3)),
        (Progress(1, 6), _parked(7), None),  # due now: a drain was missed, nothing is missing
        (Progress(2, 3), _parked(9, generation=1), None),  # an older generation: stale
        (Progress(1, 4), _parked(1, generation=2), None),  # a new generation's first seq is due
    ],
)
def test_missing_range(progress: Progress, first_parked: Event, expected: tuple | None) -> None:
    """The gap runs from the next expected seq to just before the lowest parked one."""
    assert missing_range(progress, first_parked) == expected


def _gap(generation: int, to_seq: int) -> Gap:
    now = datetime.now(UTC)
    return Gap(
        1, "l", "a", generation, 3, to_seq, "l.x", "requested", now, 1, now, None, None, None, None
    )


@pytest.mark.parametrize(
    ("gap", "progress", "expected"),
    [
        (_gap(1, 5), Progress(1, 4), False),
        (_gap(1, 5), Progress(1, 5), True),
        (_gap(1, 5), Progress(1, 9), True),
        (_gap(1, 5), Progress(2, 1), True),  # the entity moved on to a new generation
        (_gap(2, 5), Progress(1, 9), False),
    ],
)
def test_healed_once_the_range_is_applied(gap: Gap, progress: Progress, expected: bool) -> None:
    """A gap is healed when the entity has applied its last seq, or started a newer generation."""
    assert healed(gap, progress) is expected
