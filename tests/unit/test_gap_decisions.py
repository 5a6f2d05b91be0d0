"""The sweeper's pure decisions: which seqs an entity waits for, and when a gap has healed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from consumer.kinds.steps.gaps import Gap, answers, healed, missing_range, request_id
from consumer.kinds.steps.plan import Progress
from schemas import Event
from schemas.republish import RepublishResult


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


def _asked(generation: int = 1, ids: tuple[str, ...] = ("gap-1-1-a", "gap-1-2-b")) -> Gap:
    now = datetime.now(UTC)
    return Gap(
        1,
        "l",
        "a",
        generation,
        3,
        5,
        "l.x",
        "requested",
        now,
        len(ids),
        now,
        None,
        None,
        None,
        None,
        request_ids=list(ids),
    )


def _result(request: str, generation: int = 1) -> RepublishResult:
    return RepublishResult(request, "l", "a", generation, 3, 5, (), (3, 4, 5), (), False)


@pytest.mark.parametrize(
    ("gap", "result", "expected"),
    [
        (_asked(), _result("gap-1-2-b"), True),
        (_asked(), _result("gap-1-1-a"), True),  # an earlier attempt's late answer
        (_asked(), _result("gap-1-3-forged"), False),  # the gap's form, but never sent
        (_asked(), _result("gap-1-2-b", generation=2), False),  # another generation
        (_asked(generation=2), _result("gap-1-2-b"), False),  # the gap moved on since
        (_asked(ids=()), _result("gap-1-1-legacy"), True),  # a gap from before the ids
        (_asked(ids=()), _result("gap-7-1-legacy"), False),  # another gap's
        (None, _result("gap-1-2-b"), False),
    ],
)
def test_a_result_is_acted_on_only_when_it_answers_a_request_the_gap_sent(
    gap: Gap | None, result: RepublishResult, expected: bool
) -> None:
    """A result counts only for the open gap that sent its request id, of the same generation."""
    assert answers(gap, result) is expected


def test_a_resolved_gap_takes_no_answer() -> None:
    """Once resolved, even its own request's answer changes nothing."""
    gap = _asked()
    closed = Gap(
        **{**{f: getattr(gap, f) for f in gap.__dataclass_fields__}, "resolved_at": gap.first_seen}
    )
    assert not answers(closed, _result("gap-1-2-b"))


def test_request_ids_name_the_gap_and_attempt_and_cannot_be_guessed() -> None:
    """gap-<id>-<attempt>-<128 random bits>: two requests of one attempt never share an id."""
    gap = _asked()
    first, second = request_id(gap), request_id(gap)
    assert first.startswith("gap-1-3-")
    assert first != second
    assert len(first.rsplit("-", 1)[1]) == 32
