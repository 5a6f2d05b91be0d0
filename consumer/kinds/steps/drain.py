"""The step kind's drain outside the loop: the sweeper's and the operator's commands'.

The same applier drain the loop runs after each batch (``StepApplier.drain``), then its
outcome reported as the loop reports a batch's (``kinds._report``): a step given up on
is dead-lettered from its parked bytes, and everything is counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Message

from consumer.kinds._arrivals import Arrivals
from consumer.kinds._report import report
from consumer.kinds.steps.runner import StepApplier

if TYPE_CHECKING:
    from consumer.kinds._resources import Resources
    from consumer.settings import RouteSettings


def drain(
    resources: Resources[RouteSettings], applier: StepApplier, entity_ids: Sequence[str]
) -> None:
    """Apply what became due for the entities, then send its letters and count it."""
    outcome = applier.drain(resources.conn, entity_ids)
    no_messages: Arrivals[Message] = Arrivals()  # drained events came in earlier batches
    report(
        resources.conn,
        resources.producer,
        resources.settings,
        [],
        no_messages,
        [(applier, outcome)],
    )
