"""Batches in the fault suite: their route, created as a producer creates them, and judged.

A batch's items go to the example worker, whose results come back out of order; the
batch kind assembles each batch once, its results in position order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from schemas.batches import BatchItem, BatchTopics, create_batch
from tests.faults.pipeline import Pipeline

KEYS = [f"item-{i:02d}" for i in range(1, 11)]


def route(work: str, output: str) -> str:
    """A batch route whose items go to ``work`` and whose assembled batches go to ``output``."""
    return (
        f'[[route]]\nstream = "batch"\nkind = "batch"\noutput_topic = "{output}"\n'
        f'work_topic = "{work}"\n'
    )


def create(pipeline: Pipeline, work: str, batches: list[str]) -> None:
    """Each batch created in its own transaction, its items going to the worker."""
    where = BatchTopics(topic=pipeline.events_topic, work_topic=work)
    with pipeline.db.connect() as conn:
        for batch_id in batches:
            with conn.transaction():
                create_batch(
                    conn,
                    batch_id,
                    [BatchItem(k, {"k": k}) for k in KEYS],
                    where=where,
                    deadline_s=600,
                )


def complete(pipeline: Pipeline) -> int:
    """Batches the consumer marked complete."""
    return pipeline.count("SELECT count(*) FROM inorder_batches WHERE status = 'complete'")


@dataclass(frozen=True)
class Assembled:
    """What the batch kind wrote: how often each batch, and those out of order or incomplete."""

    per_batch: Counter[str]
    wrong: list[str]

    def missing(self, batches: list[str]) -> int:
        """Batches never assembled."""
        return len(set(batches) - set(self.per_batch))

    @property
    def twice(self) -> int:
        """Assemblies beyond the first of each batch."""
        return sum(n - 1 for n in self.per_batch.values())


def assembled(pipeline: Pipeline) -> Assembled:
    """Read every ``batch.assembled`` row the consumer wrote to the outbox."""
    with pipeline.db.connect() as conn:
        outputs = conn.execute(
            "SELECT entity_id, payload FROM outbox WHERE event_type = 'batch.assembled'"
        ).fetchall()
    in_order = list(enumerate(KEYS, start=1))
    wrong = [
        entity
        for entity, payload in outputs
        if [(r["position"], r["item_key"]) for r in payload["results"]] != in_order
        or payload["complete"] is not True
    ]
    return Assembled(Counter(entity for entity, _ in outputs), wrong)
