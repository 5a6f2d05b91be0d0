"""The gauges the consumer keeps from the step tables: entities stopped, for a person or a retry."""

from __future__ import annotations

import psycopg

from consumer.kinds._plugin import Conn
from consumer.kinds.steps import metrics

_STOPPED = (
    "SELECT count(*) FILTER (WHERE retry_at IS NULL), count(*) FILTER (WHERE retry_at IS NOT NULL) "
    "FROM inorder_step_progress WHERE stopped_at_seq IS NOT NULL"
)


def refresh(conn: Conn) -> None:
    """Set ``steps_needs_review`` and ``steps_retrying`` (an outage leaves them as they were)."""
    try:
        row = conn.execute(_STOPPED).fetchone()
    except psycopg.OperationalError:
        return  # the next batch notices and pauses
    metrics.NEEDS_REVIEW.set(row[0] if row else 0)
    metrics.RETRYING.set(row[1] if row else 0)
