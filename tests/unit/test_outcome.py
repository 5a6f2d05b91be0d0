"""A route's ``Outcome``: what a kind reports, merged whole and counted in one place."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

from prometheus_client import REGISTRY

from consumer.kinds import Outcome, Refusal
from consumer.kinds._barrier import merge
from schemas import Event

WHEN = "2026-12-02T10:00:00Z"


def _event(seq: int, event_type: str = "seat_ledger.seats_added") -> Event:
    return Event(f"e:{seq}", event_type, "seat_ledger", "e", 1, seq, WHEN, WHEN, {})


def _full(seq: int) -> Outcome:
    """An outcome with every field set, so a field merge forgets shows."""
    event = _event(seq)
    return Outcome(
        applied=[event],
        stale=[event],
        refused=[Refusal(event, "r", "d")],
        held=[Refusal(event, "h", "d")],
        parked=[(event, seq)],
        escalated=[event.event_type],
        stopped=1,
        retried=Counter({event.event_type: 1}),
        exhausted=Counter({(event.event_type, "skip"): 1}),
        batch_results=Counter({"done": seq}),
        batches_assembled=Counter({"complete": 1}),
        batches_inconsistent=1,
        deferred=[event],
        released=[event],
    )


def test_merge_keeps_every_field_of_both() -> None:
    """The barrier's halves merge whole: lists joined and counts added, field by field."""
    merged = merge(_full(1), _full(2))
    for f in fields(Outcome):
        value = getattr(merged, f.name)
        assert value, f"{f.name} lost in the merge"
    assert [e.seq for e in merged.applied] == [1, 2]
    assert merged.stopped == 2
    assert merged.batch_results == Counter({"done": 3})
    assert merged.batches_inconsistent == 2
    assert merged.retried == Counter({"seat_ledger.seats_added": 2})


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_count_is_the_one_place_a_kind_s_figures_become_metrics() -> None:
    """Applied, stale, parked with its distance, escalated, stopped and batch verdicts."""
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
    _full(3).count("outcome_test")
    after = [_sample(n, labels) for n, labels in names]
    assert [round(b - a) for a, b in zip(before, after, strict=True)] == [1, 1, 1, 1, 1, 1, 3, 1, 1]
