"""The step kind's Prometheus metrics (parking, gaps, retries, stops, lanes) and its tally."""

from __future__ import annotations

from collections import Counter as Counts
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from consumer import labels, metrics
from consumer.kinds._outcome import Outcome, Tally
from schemas import Event

PARKED = Counter(
    "events_parked_total", "Early events parked waiting for a predecessor", ["event_type"]
)

REORDER_DISTANCE = Histogram(
    "event_reorder_distance",
    "Early events by how far past the next expected seq they arrived: seq - last applied - 1 "
    "(8 after 6 is 1; in a new generation, the seq itself)",
    buckets=(1, 2, 3, 5, 10, 25, 100, 1000),
)

GAPS_ESCALATED = Counter(
    "event_gaps_escalated_total",
    "Gaps escalated (deadline passed or parking cap reached)",
    ["event_type"],
)

NEEDS_REVIEW = Gauge(
    "steps_needs_review",
    "Step entities stopped until a person looks at them (over every replica; refreshed at the "
    "next poll after this consumer stops one, and every 5 s)",
)

RETRYING = Gauge(
    "steps_retrying",
    "Step entities waiting for a failed step's next call (a handler's retry table; over "
    "every replica, refreshed with steps_needs_review)",
)

RETRIES = Counter(
    "step_retries_total",
    "Failed step calls that will be made again after their backoff",
    ["route", "event_type"],
)

RETRIES_EXHAUSTED = Counter(
    "step_retries_exhausted_total",
    "Steps given up on after their last call, by what the route says then "
    "(stop, dead_letter or skip)",
    ["route", "event_type", "then"],
)

LANE_EVENTS = Gauge(
    "steps_lane_events",
    "Step events taken into lanes and not yet applied or parked: the loop commits no offset "
    "past them (a handler that hangs keeps this up)",
    ["route"],
)

LANE_OLDEST_AGE = Gauge(
    "steps_lane_oldest_age_seconds",
    "How long the oldest step event in a lane has waited to be applied or parked (0: none); "
    "a call that hangs makes it grow",
    ["route"],
)

STOPPED = Counter(
    "steps_stopped_total", "Step entities this consumer stopped for a person", ["route"]
)

PARKED_CURRENT = Gauge("events_parked_current", "Events parked now, over all routes and entities")

PARKED_OLDEST_AGE = Gauge(
    "events_parked_oldest_age_seconds", "Age of the oldest park, by the consumers' clock"
)

GAPS_OPEN = Gauge("gaps_open", "Gaps by status", ["status"])

GAP_HEAL_TIME = Histogram(
    "gap_time_to_heal_seconds",
    "From a gap's detection to its range being applied",
    buckets=(1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200),
)

REPUBLISH_REQUESTED = Counter("republish_requests_sent_total", "Republish requests sent")


def entity_stopped(route: str, n: int = 1) -> None:
    """Count stopped entities and have the review gauge refreshed at the next poll."""
    STOPPED.labels(route).inc(n)
    metrics.gauges_due()


@dataclass(slots=True)
class StepTally(Tally):
    """What a step route's share did besides applying: parked, escalated, stopped, retried."""

    # Early events parked, each with how far ahead of its entity's next seq it came.
    parked: list[tuple[Event, int]] = field(default_factory=list)
    # The event type of each entity newly given up on (held: its parking set is full).
    escalated: list[str] = field(default_factory=list)
    # Entities stopped until a person looks.
    stopped: int = 0
    # Failed calls to be made again, by event type; steps given up on after their last
    # call, by (event type, what then).
    retried: Counts[str] = field(default_factory=Counts)
    exhausted: Counts[tuple[str, str]] = field(default_factory=Counts)

    def count(self, stream: str) -> None:
        """Parked with their distance, escalated, stopped, retried and exhausted."""
        for event, distance in self.parked:
            PARKED.labels(labels.event_type(event.event_type)).inc()
            REORDER_DISTANCE.observe(distance)
        for event_type in self.escalated:
            GAPS_ESCALATED.labels(labels.event_type(event_type)).inc()
        if self.stopped:
            entity_stopped(stream, self.stopped)
        for event_type, n in self.retried.items():
            RETRIES.labels(stream, labels.event_type(event_type)).inc(n)
        for (event_type, then), n in self.exhausted.items():
            RETRIES_EXHAUSTED.labels(stream, labels.event_type(event_type), then).inc(n)
        if self.retried or self.exhausted:
            metrics.gauges_due()

    def attributes(self) -> dict[str, int]:
        """How many events of the share parked."""
        return {"inorder.parked": len(self.parked)}


def tally(outcome: Outcome) -> StepTally:
    """The step figures of an outcome, started when it holds none yet."""
    if isinstance(outcome.tally, StepTally):
        return outcome.tally
    started = StepTally()
    outcome.tally = outcome.tally + started  # a tally of another kind cannot be added to
    return started
