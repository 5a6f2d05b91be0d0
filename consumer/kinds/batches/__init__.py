"""The ``batch`` kind: a manifest per batch, worker results by position, output in position order.

Following one poll batch down: ``route`` (settings), ``runner`` (the route's applier,
and the sweeper's and operator's entry points: load, decide, write), ``incoming``
(events read into manifests and results, pure), ``plan`` (the share's decisions over
what was loaded, pure), ``decisions`` (one result's verdict, one batch's branch, the
assembled payload, pure), ``store`` (every statement). Beside the loop:
``duties`` (expiry, run by the sweeper), ``inspect`` (explain), ``commands``
(``inorder-admin batches``).
"""

from consumer.kinds._base import Kind
from consumer.kinds.batches import commands, duties, metrics, startup
from consumer.kinds.batches.inspect import BatchInspector
from consumer.kinds.batches.route import BatchRoute, parse
from consumer.kinds.batches.runner import BatchApplier
from schemas import outbox

# Assembled output and re-dispatched work leave through the consumer's own outbox.
KIND = Kind(
    "batch",
    parse,
    BatchApplier,
    migrations=(outbox.MIGRATIONS,),
    check=startup.check,
    settings=(BatchRoute,),
    duties=duties.duties,
    inspector=BatchInspector(),
    commands=commands.COMMANDS,
    metrics=metrics,
)

__all__ = ["KIND", "BatchApplier", "BatchRoute"]
