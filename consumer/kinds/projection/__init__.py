"""The ``projection`` kind: last writer wins, the newest event of each entity, one upsert per batch.

``table`` is the route, its start-up check and the upsert; ``inspect`` its part of
``inorder-admin explain``, ``audit`` and ``republish``. It has no periodic duties and
no commands of its own.
"""

from consumer.kinds._base import Kind
from consumer.kinds.projection.inspect import ProjectionInspector
from consumer.kinds.projection.table import (
    ProjectionApplier,
    ProjectionRoute,
    apply,
    check_table,
    field_value,
    newest_per_entity,
    parse,
    record,
    stored_row,
)

KIND = Kind(
    "projection",
    parse,
    ProjectionApplier,
    settings=(ProjectionRoute,),
    inspector=ProjectionInspector(),
)

__all__ = [
    "KIND",
    "ProjectionApplier",
    "ProjectionRoute",
    "apply",
    "check_table",
    "field_value",
    "newest_per_entity",
    "record",
    "stored_row",
]
