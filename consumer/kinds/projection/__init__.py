"""The ``projection`` kind: last writer wins, the newest event of each entity, one upsert per batch.

``route`` is its part of the routes file, ``upsert`` its pure decisions and statement,
``catalog`` its table's checks, ``table`` the writes; ``inspect`` its part of
``inorder-admin explain``, ``audit`` and ``republish``. It has no periodic duties and
no commands of its own.
"""

from consumer.kinds._base import Kind
from consumer.kinds.projection.catalog import check_table
from consumer.kinds.projection.inspect import ProjectionInspector
from consumer.kinds.projection.route import ProjectionRoute, parse, together
from consumer.kinds.projection.table import ProjectionApplier, apply, stored_row
from consumer.kinds.projection.upsert import field_value, newest_per_entity, record

KIND = Kind(
    "projection",
    parse,
    ProjectionApplier,
    settings=(ProjectionRoute,),
    inspector=ProjectionInspector(),
    together=together,
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
