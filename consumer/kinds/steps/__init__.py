"""The ``step`` kind: every event applied once, in seq order; early arrivals parked in Redis.

Following one poll batch down: ``route`` (settings, handlers imported), ``runner``
(the route's applier), ``apply`` (transactions, external calls one by one), ``plan``
and ``ladder`` (the pure decisions: what applies, parks or is stale; how to try again),
``handlers`` (the one module calling the users' functions), ``lanes`` and ``inflight``
(entities applied one by one past the batch; ``looped``: as coroutines on the lanes'
event loop, for ``async def`` handlers), ``store`` (every
statement), ``parking`` (the Redis keys and scripts), ``transaction`` (pipelined
commits). Beside the loop: ``duties`` (what the
sweeper repairs: ``gaps``), ``inspect`` (explain and audit), ``commands`` (gaps,
parked, skip, held and review in inorder-admin), ``gauges`` (stopped entities).
"""

from consumer.kinds._base import Kind
from consumer.kinds.steps import commands, duties, gauges, metrics, startup, upgrade
from consumer.kinds.steps.inspect import StepInspector
from consumer.kinds.steps.retries import Retry
from consumer.kinds.steps.route import Handler, StepRoute, parse
from consumer.kinds.steps.runner import StepApplier
from consumer.kinds.steps.settings import StepSettings

KIND = Kind(
    "step",
    parse,
    StepApplier,
    check=startup.check,
    upgrade=upgrade.upgrade,
    settings=(StepRoute, Handler, Retry),
    duties=duties.duties,
    inspector=StepInspector(),
    commands=commands.COMMANDS,
    gauges=gauges.refresh,
    metrics=metrics,
    process=StepSettings,
)

__all__ = ["KIND", "Handler", "StepApplier", "StepRoute"]
