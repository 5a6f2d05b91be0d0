"""A batch end to end: producer, relay, example worker, consumer, relay again, output topic."""

from __future__ import annotations

import os
import subprocess
import uuid
from contextlib import ExitStack
from pathlib import Path

import orjson

from producer.worker import Worker, WorkerPlan, WorkerSettings
from schemas import decode
from schemas.batches import BatchItem, BatchTopics, create_batch
from tests.conftest import PgSchema, TopicFactory
from tests.integration import batch_support as bs
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration.sweeper_support import tool
from tests.support.kafka import drain, wait_until
from tests.support.services import Services
from tests.support.threads import serving


def test_batches_flow_from_producer_to_output_topic_in_position_order(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Workers finish out of order and one item fails once; every output is by position."""
    batch = bs.setup(pg_schema, services, topic_factory, tmp_path, max_retries=1)
    where = BatchTopics(topic=batch.events, work_topic=batch.work)
    ids = [f"flow-{n}-{uuid.uuid4().hex[:6]}" for n in range(5)]
    keys = [f"item-{i:02d}" for i in range(1, 9)]
    with pg_schema.connect() as conn:
        for batch_id in ids:
            with conn.transaction():
                create_batch(conn, batch_id, [BatchItem(k, {"k": k}) for k in keys], where=where)
    topics = rs.RelayTopics(batch.events, topic_factory("requests"), topic_factory("results"))
    worker = Worker(
        WorkerSettings(
            DATABASE_URL=pg_schema.url,
            KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap,
            work_topic=batch.work,
            events_topic=batch.events,
            group_id=f"w-{uuid.uuid4().hex[:6]}",
        ),
        WorkerPlan(max_delay_ms=150, fail_first=frozenset({"item-03"}), seed=7),
    )
    with ExitStack() as stack:
        stack.enter_context(
            rs.running(rs.settings_for(pg_schema, services.kafka_bootstrap, topics))
        )
        stack.enter_context(cs.running(batch.settings))
        stack.enter_context(serving("worker", worker.run, worker.stop))
        wait_until(
            lambda: all((bs.status(pg_schema, b) or ("",))[0] == "complete" for b in ids),
            timeout_s=90,
        )
        published = drain(services.kafka_bootstrap, batch.output, expect=len(ids))
    outputs = [decode(m.value()) for m in published]
    assert sorted(o.entity_id for o in outputs) == sorted(ids)
    for output in outputs:
        assert output.payload["complete"] is True
        assert bs.positions(dict(output.payload)) == list(enumerate(keys, start=1))
    # Each batch's item-03 failed once and was dispatched again as attempt 2.
    assert all(bs.work_items(pg_schema, b) == [(3, 2)] for b in ids)
    assert worker.reported == len(ids) * (len(keys) + 1)


def test_admin_cli_lists_and_shows_batches(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """`inorder-admin batches list|show|confirm-retry` work as commands, JSON or tables."""
    batch = bs.setup(pg_schema, services, topic_factory, tmp_path)
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send([bs.result(batch_id, p) for p in (1, 2, 3, 5)])
        batch.send([bs.result(batch_id, 4, ok=False, uncertain=True)])
        wait_until(lambda: (bs.status(pg_schema, batch_id) or ("",))[0] == "incomplete")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")}
    env.update(
        DATABASE_URL=pg_schema.url,
        KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap,
        REDIS_URL=services.redis_url,
        INORDER_ROUTES_FILE=str(batch.settings.routes_file),
        INORDER_TOPICS=f'["{batch.events}"]',
        INORDER_REDIS_KEY_PREFIX=f"t{uuid.uuid4().hex[:6]}",
    )

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool("inorder-admin"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    listed = admin("--json", "batches", "list")
    assert listed.returncode == 0, listed.stderr
    [row] = [orjson.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    assert (row["batch_id"], row["status"], row["done"], row["not_done"]) == (
        batch_id,
        "incomplete",
        4,
        1,
    )
    piped = admin("batches", "list")  # not a terminal: every column in full, tab-separated
    title, header, line = piped.stdout.splitlines()
    assert title == "# batches"
    assert dict(zip(header.split("\t"), line.split("\t"), strict=True)) == {
        k: "" if v is None else str(v) for k, v in row.items()
    }
    shown = admin("batches", "show", batch_id)
    assert shown.returncode == 0, shown.stderr
    assert "needs_review" in shown.stdout
    assert "incomplete" in shown.stdout
    refused = admin("batches", "confirm-retry", batch_id, "2", "--reason", "x")
    assert refused.returncode == 1
    assert "position 2 is done" in refused.stderr
    settled = admin("batches", "confirm-retry", batch_id, "4", "--applied", "r/D", "--reason", "ok")
    assert settled.returncode == 0, settled.stderr
    assert (bs.status(pg_schema, batch_id) or ("",))[0] == "complete"
