"""Test your own routes under reordering, duplicates and batch splits, without Kafka.

``RouteDriver`` runs a routes file's routes with the consumer's own code on a real
PostgreSQL connection (and a real Redis for step routes), one poll batch per ``send``;
``event`` builds events without envelopes; ``check_order_independence`` applies events
in order once, then in many arrival orders (Hypothesis, seeded, shrinking), and fails
with the smallest arrival that leaves different rows. The order checks need the
``testing`` extra (Hypothesis); they are imported when first used, so the pytest plugin
and the driver work without it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from consumer.testing._driver import RouteDriver, Sent, event
from consumer.testing._scratch import scratch

if TYPE_CHECKING:
    from consumer.testing._orders import (
        OrderDependenceError,
        arrivals,
        check_order_independence,
    )

_NEED_HYPOTHESIS = ("OrderDependenceError", "arrivals", "check_order_independence")

__all__ = [
    "OrderDependenceError",
    "RouteDriver",
    "Sent",
    "arrivals",
    "check_order_independence",
    "event",
    "scratch",
]


def __getattr__(name: str) -> Any:
    if name in _NEED_HYPOTHESIS:
        return getattr(import_module("consumer.testing._orders"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
