"""The ``step`` kind: every event applied once, in seq order; early arrivals parked in Redis.

Following one poll batch down: ``route`` (settings, handlers imported), ``runner``
(the route's applier), ``apply`` (transactions, retries, external calls), ``plan``
(the pure decisions), ``store`` (every statement), ``parking`` (the Redis keys and
scripts), ``connection`` (one Redis or a Redis Cluster, and whether it keeps parks).
"""

from consumer.kinds._base import Kind
from consumer.kinds.steps.route import Handler, StepRoute, parse
from consumer.kinds.steps.runner import StepApplier

KIND = Kind("step", parse, StepApplier, needs_redis=True, settings=(StepRoute, Handler))

__all__ = ["KIND", "Handler", "StepApplier", "StepRoute"]
