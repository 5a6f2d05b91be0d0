"""A batch route's part of ``inorder-admin``: a batch's row and manifest for ``explain``.

The outbox holds a batch's manifest and its workers' results, not its assembled state,
so the audit has nothing to compare: a batch is judged by its manifest (``batches
show``), and an inconsistent one is stopped and counted when it arrives.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from consumer.kinds._audit import Audit
from consumer.kinds._plugin import Conn, Findings
from consumer.kinds._resources import Resources
from consumer.kinds.batches.route import BatchRoute
from consumer.kinds.batches.store import BatchStore

if TYPE_CHECKING:
    from consumer.settings import SweeperSettings


class BatchInspector:
    """What a batch route shows an operator about one batch (the entity is the batch)."""

    def generation(self, conn: Conn, route: BatchRoute, entity_id: str) -> int | None:
        """The generation of the batch's stored manifest (None: no manifest yet)."""
        batch = BatchStore(route.stream).batches(conn, [entity_id]).get(entity_id)
        return None if batch is None else batch.generation

    def story(
        self, tools: Resources[SweeperSettings], route: BatchRoute, entity_id: str
    ) -> Findings:
        """The batch's row and its positions."""
        store = BatchStore(route.stream)
        batch = store.batches(tools.conn, [entity_id]).get(entity_id)
        if batch is None:
            return Findings()
        items = [asdict(i) for i in store.all_items(tools.conn, entity_id)]
        return Findings(applied=asdict(batch), sections={"positions": ("positions", items)})

    def audit(self, audit: Audit, route: BatchRoute) -> None:
        """Nothing to compare: the manifest is the batch's own audit."""
