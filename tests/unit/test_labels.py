"""Producer-written label values are bounded: past the limit, new ones share one series."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from consumer import labels
from consumer.kinds._outcome import Outcome
from schemas import Event


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    labels.forget_all()
    yield
    labels.forget_all()


def test_the_first_event_types_keep_their_own_label_and_the_rest_share_one() -> None:
    """Up to MOST_EVENT_TYPES values are themselves (again and again); any other is OTHER."""
    first = [f"t.n{i}" for i in range(labels.MOST_EVENT_TYPES)]
    assert [labels.event_type(v) for v in first] == first
    assert labels.event_type("t.late") == labels.OTHER
    assert labels.event_type(first[7]) == first[7]


def test_a_producer_writing_a_new_event_type_per_event_adds_no_series_past_the_limit() -> None:
    """Stale events of 1,000 event types: at most MOST_EVENT_TYPES + 1 series of the counter."""
    when = "2026-12-05T10:00:00Z"
    stale = [Event(f"e{i}", f"flood.t{i}", "flood", "a", 1, 1, when, when, {}) for i in range(1000)]
    Outcome(stale=stale).count("flood")
    series = {
        sample.labels["event_type"]
        for metric in REGISTRY.collect()
        if metric.name == "events_stale"
        for sample in metric.samples
        if sample.labels.get("event_type", "").startswith("flood.")
        or sample.labels.get("event_type") == labels.OTHER
    }
    assert len(series) == labels.MOST_EVENT_TYPES + 1
    assert labels.OTHER in series
