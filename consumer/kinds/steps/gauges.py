"""The gauge the consumer keeps from the step tables: entities stopped for a person."""

from __future__ import annotations

import psycopg

from consumer import metrics
from consumer.kinds._plugin import Conn

_STOPPED = "SELECT count(*) FROM inorder_step_progress WHERE stopped_at_seq IS NOT NULL"


def refresh(conn: Conn) -> None:
    """Set ``steps_needs_review`` from the progress table (an outage leaves it as it was)."""
    try:
        row = conn.execute(_STOPPED).fetchone()
    except psycopg.OperationalError:
        return  # the next batch notices and pauses
    metrics.NEEDS_REVIEW.set(row[0] if row else 0)
