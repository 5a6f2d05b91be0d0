"""Test your own routes under reordering, duplicates and batch splits, without Kafka.

``RouteDriver`` runs a routes file's routes with the consumer's own code on a real
PostgreSQL connection (and a real Redis for step routes), one poll batch per ``send``;
``event`` builds events without envelopes; ``check_order_independence`` applies events
in order once, then in many arrival orders (Hypothesis, seeded, shrinking), and fails
with the smallest arrival that leaves different rows. Needs the ``testing`` extra.
"""

from consumer.testing._driver import RouteDriver, Sent, event
from consumer.testing._orders import OrderDependenceError, arrivals, check_order_independence

__all__ = [
    "OrderDependenceError",
    "RouteDriver",
    "Sent",
    "arrivals",
    "check_order_independence",
    "event",
]
