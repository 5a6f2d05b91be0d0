"""What an outcome still asks for once its work is committed, in one place and one order.

Letters first (refused events to the dead-letter topic, held ones to the held topic,
both flushed), then the dead letters recorded in PostgreSQL, then every metric (what
each route applied and ignored, the apply latency). The loop reports a poll batch's
outcomes this way before its source hears the batch is done, and so does work a route
carried past its batch when it finishes; the sweeper's and the operator's drains
report theirs the same way. Anything that fails here fails before an event is marked
done, so it is applied again after the outage, and the routes are idempotent.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import structlog
from confluent_kafka import Message, Producer

from consumer import deadletter, metrics
from consumer.deadletter import DeadLetter
from consumer.kinds._base import Applier
from consumer.kinds._outcome import Outcome, Refusal
from schemas import Event, tracing

if TYPE_CHECKING:
    from consumer.settings import RouteSettings

log = structlog.get_logger(__name__)


def report(
    conn: psycopg.Connection[Any],
    producer: Producer,
    settings: RouteSettings,
    dead: Sequence[DeadLetter],
    by_event: Mapping[Event, Message],
    outcomes: Sequence[tuple[Applier[Any], Outcome]],
) -> None:
    """Letters (dead and held) sent and recorded, then the counts and latencies.

    ``by_event``: the message each event came in, for a letter's copy and the latency
    (outcomes of work carried past its batch name events of earlier batches).
    """
    refused = [*dead, *_letters(by_event, [r for _, o in outcomes for r in o.refused])]
    held = _letters(by_event, [h for _, o in outcomes for h in o.held])
    deadletter.post(conn, producer, settings, refused, held)
    # Latency is per entity: how late its state shows its newest event of this batch
    # (events drained from parking arrived in an earlier batch and have no message here).
    # While tracing, the batch's slowest latency names the trace its event was written in
    # (an exemplar): Prometheus keeps one per bucket, and the slowest is the one to follow.
    now = time.time()
    latencies: list[tuple[float, Message]] = []
    for applier, outcome in outcomes:
        outcome.count(applier.route.stream)
        newest = {e.entity_id: e for e in outcome.applied if e in by_event}
        for event in newest.values():
            message = by_event[event]
            latencies.append((max(0.0, now - message.timestamp()[1] / 1000), message))
    slowest = max(range(len(latencies)), key=lambda i: latencies[i][0], default=None)
    for i, (late, message) in enumerate(latencies):
        named = None
        if i == slowest and tracing.active():
            named = tracing.exemplar(tracing.creation_context(message.headers()))
        metrics.APPLY_LATENCY.observe(late, exemplar=named)


def _letters(by_event: Mapping[Event, Message], refusals: Sequence[Refusal]) -> list[DeadLetter]:
    """Dead-letter copies of the messages the routes refused (or held), with the reason.

    A refusal without its message can only come from a lane that took the event in a
    try of its batch that then failed on an outage: the batch is tried again, and the
    copy it gives the lane is refused, and lettered, in its turn.
    """
    letters = []
    for refusal in refusals:
        message = by_event.get(refusal.event)
        if message is None and refusal.copy is not None:  # drained from parking
            letters += deadletter.unsent([refusal])
            continue
        if message is None:
            log.info(
                "letter_left_to_the_retried_batch",
                reason=refusal.reason,
                entity=refusal.event.entity_id,
                seq=refusal.event.seq,
            )
            continue
        letters.append(DeadLetter(message, refusal.reason, refusal.detail, refusal.event))
    return letters
