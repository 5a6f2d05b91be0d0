"""Twelve consumers in a share group on three partitions, killed and frozen: still correct.

A share group hands one entity's events to many members at the same moment, with no
order at all. The proof runs the route kinds share mode takes (projections, steps in
the transaction, batches; a route with external calls is refused at start-up), kills
two members with SIGKILL and freezes a third past its acquisition lock, each while it
takes records, then judges as the fault suite does: every projection at its newest
version, every step once and in order, every batch assembled once, the audit clean.
The end state is judged, so a record the source lost and the sweeper's republish
healed passes too: this proves the outcome, not yet the source's acknowledgements.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from schemas.batches import BatchItem, BatchTopics, create_batch
from tests.conftest import PgSchema, TopicFactory
from tests.faults import effects
from tests.faults.conftest import Scale, report
from tests.faults.pipeline import Pipeline
from tests.faults.test_faults import _complete, start
from tests.support.services import Services

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(900)]

MEMBERS = tuple(f"consumer-{n}" for n in range(1, 13))
LOCK_MS = 8000


def test_twelve_share_members_killed_and_frozen_stay_correct(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    scale: Scale,
) -> None:
    """12 share members, 3 partitions, every kind; 2 killed, 1 frozen past its lock: all once."""
    work, output = topic_factory("work"), topic_factory("output")
    batch_route = (
        f'[[route]]\nstream = "batch"\nkind = "batch"\noutput_topic = "{output}"\n'
        f'work_topic = "{work}"\n'
    )
    pipeline = Pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        routes=effects.ROUTES + batch_route,
        partitions=3,
        INORDER_WORK_TOPIC=work,
        INORDER_CONSUMER_MODE="share",
        INORDER_SHARE_RECORD_LOCK_MS=str(LOCK_MS),
        INORDER_SHARE_MAX_POLL_RECORDS="5",
        INORDER_SHARE_LOCK_MARGIN_MS="2000",
        INORDER_KAFKA_EXTRA="{}",
    )
    pipeline.env["INORDER_EVENTS_TOPIC"] = pipeline.events_topic  # where results go
    batches = [f"share-batch-{n:03d}" for n in range(scale.entities)]
    keys = [f"item-{i:02d}" for i in range(1, 11)]
    try:
        start(pipeline, "relay-1", "sweeper-1", "worker-1", *MEMBERS)
        started = time.monotonic()
        load = pipeline.load(scale.entities, scale.ops_per_entity, scale.rate, seed=5)
        _create_batches(pipeline, work, batches, keys)
        pipeline.wait_for("load under way", lambda: load.written > scale.entities * 2)
        # The faults land on the members taking the most records (the broker hands
        # records out by produced batch, so some members may take none).
        pipeline.wait_for("three members taking records", lambda: len(_busiest(pipeline)) >= 3)
        first, frozen, second = _busiest(pipeline)[:3]
        pipeline.kill(first)
        pipeline.pause(frozen)  # frozen: its records' lock runs out
        pipeline.kill(second)
        time.sleep(LOCK_MS / 1000 + 3)
        pipeline.resume(frozen)
        load.join()
        pipeline.wait_for("every batch complete", lambda: _complete(pipeline) == len(batches), 240)
        pipeline.settle(timeout=240)
        with pipeline.db.connect() as conn:
            outputs = conn.execute(
                "SELECT entity_id, payload FROM outbox WHERE event_type = 'batch.assembled'"
            ).fetchall()
        per_batch = Counter(entity for entity, _ in outputs)
        in_order = list(enumerate(keys, start=1))
        wrong = [
            e
            for e, p in outputs
            if [(r["position"], r["item_key"]) for r in p["results"]] != in_order
            or p["complete"] is not True
        ]
        verdict = pipeline.verdict()
        twice = sum(n - 1 for n in per_batch.values())
        lost = len(batches) - len(per_batch)
        report(
            "share group: 12 members, 2 killed, 1 frozen past its lock",
            3,
            replace(
                verdict,
                lost=verdict.lost + lost,
                applied_twice=verdict.applied_twice + twice,
            ),
            time.monotonic() - started,
        )
        assert sorted(per_batch) == sorted(batches), "a batch was never assembled"
        assert twice == 0, f"assembled more than once: {per_batch.most_common(2)}"
        assert not wrong, f"out of order or incomplete: {wrong[:3]}"
        assert verdict.clean, f"{verdict}; logs in {pipeline.logs}"
    finally:
        pipeline.close()


def _create_batches(pipeline: Pipeline, work: str, batches: list[str], keys: list[str]) -> None:
    """Each batch created as a producer does, its items going to the worker."""
    where = BatchTopics(topic=pipeline.events_topic, work_topic=work)
    with pipeline.db.connect() as conn:
        for batch_id in batches:
            with conn.transaction():
                create_batch(
                    conn,
                    batch_id,
                    [BatchItem(k, {"k": k}) for k in keys],
                    where=where,
                    deadline_s=600,
                )


def _busiest(pipeline: Pipeline) -> list[str]:
    """The members that have acquired records, the most first."""
    taken = {name: pipeline.metric(name, "share_records_acquired_total") for name in MEMBERS}
    return sorted((n for n, count in taken.items() if count > 0), key=lambda n: -taken[n])
