"""A route's ``Outcome``: what a kind reports, merged whole and counted in one place."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

import pytest
from prometheus_client import REGISTRY

from consumer.kinds import Outcome, Refusal, Tally
from consumer.kinds._outcome import merge
from consumer.kinds.batches.metrics import BatchTally
from consumer.kinds.steps.metrics import StepTally, tally
from schemas import Event

WHEN = "2026-12-02T10:00:00Z"


def _event(seq: int, event_type: str = "seat_ledger.seats_added") -> Event:
    return Event(f"e:{seq}", event_type, "seat_ledger", "e", 1, seq, WHEN, WHEN, {})


def _steps(seq: int) -> StepTally:
    event = _event(seq)
    return StepTally(
        parked=[(event, seq)],
        escalated=[event.event_type],
        stopped=1,
        retried=Counter({event.event_type: 1}),
        exhausted=Counter({(event.event_type, "skip"): 1}),
    )


def _full(seq: int, kind_tally: Tally) -> Outcome:
    """An outcome with every field set, so a field merge forgets shows."""
    event = _event(seq)
    return Outcome(
        applied=[event],
        stale=[event],
        refused=[Refusal(event, "r", "d")],
        held=[Refusal(event, "h", "d")],
        deferred=[event],
        released=[event],
        tally=kind_tally,
    )


def test_merge_keeps_every_field_of_both() -> None:
    """The barrier's halves merge whole: lists joined, the kind's counts added, field by field."""
    merged = merge(_full(1, _steps(1)), _full(2, _steps(2)))
    for f in fields(Outcome):
        assert getattr(merged, f.name), f"{f.name} lost in the merge"
    assert [e.seq for e in merged.applied] == [1, 2]
    steps = merged.tally
    assert isinstance(steps, StepTally)
    for f in fields(StepTally):
        assert getattr(steps, f.name), f"{f.name} lost in the merge"
    assert steps.stopped == 2
    assert steps.retried == Counter({"seat_ledger.seats_added": 2})
    batches = merge(
        _full(1, BatchTally(Counter({"done": 1}))), _full(2, BatchTally(inconsistent=1))
    )
    assert batches.tally == BatchTally(Counter({"done": 1}), Counter(), 1)


def test_an_empty_tally_gives_way_and_two_kinds_never_add_up() -> None:
    """A refusal's outcome (no tally) merges into a kind's; a step and a batch tally refuse to."""
    merged = merge(Outcome(refused=[Refusal(_event(1), "r", "d")]), _full(2, _steps(2)))
    assert merged.tally == _steps(2)
    plain = Outcome()
    tally(plain).stopped += 1
    assert plain.tally == StepTally(stopped=1)
    with pytest.raises(TypeError):
        merge(_full(1, _steps(1)), _full(2, BatchTally()))


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_count_is_the_one_place_a_kind_s_figures_become_metrics() -> None:
    """Applied and stale by the core; parked, stopped, batch verdicts and the rest by their kind."""
    names = [
        ("events_applied_total", {"route": "outcome_test"}),
        ("events_stale_total", {"event_type": "seat_ledger.seats_added"}),
        ("events_parked_total", {"event_type": "seat_ledger.seats_added"}),
        ("event_reorder_distance_count", None),
        ("event_gaps_escalated_total", {"event_type": "seat_ledger.seats_added"}),
        ("steps_stopped_total", {"route": "outcome_test"}),
        ("batch_results_total", {"verdict": "done"}),
        ("batches_assembled_total", {"outcome": "complete"}),
        ("batches_inconsistent_total", None),
    ]
    before = [_sample(n, labels) for n, labels in names]
    _full(3, _steps(3)).count("outcome_test")
    _full(3, BatchTally(Counter({"done": 3}), Counter({"complete": 1}), 1)).count("outcome_test")
    after = [_sample(n, labels) for n, labels in names]
    assert [round(b - a) for a, b in zip(before, after, strict=True)] == [2, 2, 1, 1, 1, 1, 3, 1, 1]
