"""After apply: a poll batch's letters and counts (``kinds._report``), before it is done.

The messages no route could read (undecodable, unrouted) are lettered with the routes'
refusals; the loop tells its source the batch is done only after all of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import structlog
from confluent_kafka import Producer

from consumer.kinds import Applier, Outcome
from consumer.kinds._report import report
from consumer.loop.poll import Prepared
from consumer.settings import RouteSettings

log = structlog.get_logger(__name__)


def settle(
    conn: psycopg.Connection[Any],
    producer: Producer,
    settings: RouteSettings,
    prepared: Prepared,
    outcomes: Sequence[tuple[Applier[Any], Outcome]],
) -> None:
    """Send and record the batch's letters, then count it; its messages are done after.

    The counts come after the letters: a batch applied again after an outage in between
    is counted once.
    """
    report(conn, producer, settings, prepared.dead, prepared.by_event, outcomes)
