"""Parks Redis loses in a machine crash are found from PostgreSQL and repaired from the outbox."""

from __future__ import annotations

import dataclasses
import shutil
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from pydantic import SecretStr

from consumer.kinds.steps.parking import ParkingLot
from tests.conftest import PgSchema, TopicFactory
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import wait_until
from tests.support.redis_server import private_redis
from tests.support.services import Services


def _offsets_committed(p: sw.Pipeline) -> bool:
    """Whether the consumer group's committed offsets reached the end of every partition."""
    config = {
        "bootstrap.servers": p.services.kafka_bootstrap,
        "group.id": p.group_id,
        "enable.auto.commit": False,
    }
    probe = Consumer(config)
    try:
        metadata = probe.list_topics(p.topics.events, timeout=10)
        partitions = [
            TopicPartition(p.topics.events, n) for n in metadata.topics[p.topics.events].partitions
        ]
        committed = probe.committed(partitions, timeout=10)
        return all(
            c.offset == probe.get_watermark_offsets(c, timeout=10)[1]
            for c in committed
            if probe.get_watermark_offsets(c, timeout=10)[1] > 0
        )
    finally:
        probe.close()


@pytest.mark.timeout(180)
def test_parks_lost_in_a_redis_crash_are_republished_and_the_audit_ends_clean(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Seq 3 lost, 4 and 5 parked and their offsets committed, then Redis loses its last writes."""
    with private_redis(tmp_path) as server:
        p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
        p = dataclasses.replace(
            p, settings=p.settings.model_copy(update={"redis_url": SecretStr(server.url)})
        )
        sw.write_outbox(p, range(1, 3))
        with ExitStack() as stack:
            stack.enter_context(sw.running(p, sweeper=False))
            wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 2, timeout_s=60)
            on_disk = tmp_path / "on-disk"
            shutil.copytree(server.folder, on_disk)  # the disk as the last fsync left it
            with pg_schema.connect() as conn:  # 3 never sent; 4 and 5 arrive early
                for seq in (3, 4, 5):
                    conn.execute(
                        "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, "
                        "event_id, payload) VALUES (%s, 'ledger', 'a', %s, 'ledger.added', %s, "
                        "%s)",
                        (p.topics.events, seq, f"a:1:{seq}", f'{{"amount": {seq}}}'),
                    )
                conn.execute("UPDATE outbox SET xid = '0' WHERE seq = 3")
                conn.commit()
            parked = redis.Redis.from_url(server.url)
            key = ParkingLot(parked, p.settings.redis_key_prefix).entity_key(ss.STREAM, "a")
            wait_until(lambda: parked.zcard(key) == 2, timeout_s=30)
            parked.close()
            wait_until(lambda: _offsets_committed(p), timeout_s=30)
            server.crash()  # the machine goes down: Redis comes back with the disk's state
            shutil.rmtree(server.folder)
            shutil.copytree(on_disk, server.folder)
            server.start()
            check = redis.Redis.from_url(server.url)
            assert check.zcard(key) == 0, "the rolled-back Redis still holds the parks"
            check.close()
            sw.start_sweeper(p, stack)
            wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 5, timeout_s=60)
            wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=30)
        [(status, first, last, attempts, by, _)] = sw.gap_rows(p)
        assert (status, first, last, by) == ("healed", 3, 5, "sweeper")
        assert attempts >= 1
        assert ss.applied(pg_schema) == [(1, s) for s in range(1, 6)]
        audit = sw.admin(p, "--json", "audit")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert '"unexplained":0' in audit.stdout
        story = orjson.loads(sw.admin(p, "--json", "explain", "ledger:a").stdout)
        assert story["gaps"][0]["range"] == "1/3..5"
