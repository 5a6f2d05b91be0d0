"""Sweeper: a sweep's cost against the number of parked entities, and how fast a lost event heals.

``sweep_ratio_100k_vs_100``: one sweep with 100,000 parked entities, none overdue,
against the same with 100 (best of 7 each, alternating). ``gap_heal_s``: relay,
consumer and sweeper run in this process on a 1 s deadline; one outbox row is
marked published without being sent; the figure is from the deadline (first park
+ 1 s) to the gap recorded healed.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
import redis
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from consumer.kinds.steps.parking import ParkingLot
from consumer.routes import parse_routes
from consumer.service import ConsumerService
from consumer.settings import ConsumerSettings, RouteSettings, SweeperSettings
from consumer.sweeper.service import Sweeper
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from producer import migrate
from schemas.runtime.health import Health
from tests.benchmarks.fixtures import temp_schema
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized
from tests.integration import step_handlers
from tests.integration.relay_support import TEST_SCHEMAS
from tests.support.threads import serving

ROUTES = """[[route]]
stream = "ledger"
kind = "step"
[route.handlers]
"ledger.added" = "tests.integration.step_handlers:record"
"""
NAMES = ("events", "requests", "results", "dlq", "held")
# The longest wait for the lost event to be repaired (its deadline is a few seconds).
HEAL_WAIT_S = 120


@contextmanager
def _topics(bootstrap: str) -> Iterator[dict[str, str]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tag = uuid.uuid4().hex[:8]
    topics = {name: f"bench.sweeper.{tag}.{name}" for name in NAMES}
    for future in admin.create_topics([NewTopic(t, 3, 1) for t in topics.values()]).values():
        future.result(timeout=30)
    try:
        yield topics
    finally:
        for future in admin.delete_topics(list(topics.values())).values():
            future.result(timeout=30)


def _settings(url: str, routes: Path, topics: dict[str, str], prefix: str) -> SweeperSettings:
    return SweeperSettings(
        DATABASE_URL=url,
        KAFKA_BOOTSTRAP_SERVERS=os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        REDIS_URL=os.environ["REDIS_URL"],
        routes_file=routes,
        topics=[topics["events"]],
        dead_letter_topic=topics["dlq"],
        held_topic=topics["held"],
        republish_requests_topic=topics["requests"],
        republish_results_topic=topics["results"],
        sweeper_group_id=f"s-{uuid.uuid4().hex[:8]}",
        redis_key_prefix=prefix,
        create_topics=False,
        http_port=0,
        gap_deadline_s=1.0,
        republish_backoff_base_s=1.0,
        sweep_interval_s=0.2,
        lease_ttl_s=3.0,
    )


def _consumer(settings: SweeperSettings) -> ConsumerSettings:
    """The consumer's settings beside the sweeper's: what the routes share, a group of its own."""
    shared = {name: getattr(settings, name) for name in RouteSettings.model_fields}
    return ConsumerSettings.model_construct(**shared, group_id=f"c-{uuid.uuid4().hex[:8]}")


def _sweep_seconds(sweeper: Sweeper, client: redis.Redis, lot: ParkingLot, entities: int) -> float:
    client.delete(*lot.index_keys("ledger"))
    now = time.time()
    for start in range(0, entities, 10_000):
        by_index: dict[str, dict[str, float]] = {}
        for i in range(start, min(entities, start + 10_000)):
            by_index.setdefault(lot.index_key("ledger", f"e{i}"), {})[f"e{i}"] = now
        for index, members in by_index.items():
            client.zadd(index, members)
    best = float("inf")
    for _ in range(7):
        started = time.perf_counter()
        sweeper.sweep()
        best = min(best, time.perf_counter() - started)
    return best


def _heal_seconds(settings: SweeperSettings, url: str, client: redis.Redis) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.apply(conn)
        with conn.transaction():
            for seq in range(1, 6):
                conn.execute(
                    "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, "
                    "event_id, payload) VALUES (%s, 'ledger', 'lost', %s, 'ledger.added', %s, "
                    "'{}')",
                    (settings.topics[0], seq, f"lost:1:{seq}"),
                )
            # Lost as Kafka would lose it: behind every cursor before the relay sees it (the
            # stamping trigger sets xid on INSERT only).
            conn.execute("UPDATE outbox SET xid = '0' WHERE entity_id = 'lost' AND seq = 3")
    relay = RelaySettings(
        DATABASE_URL=url,
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
        republish_requests_topic=settings.republish_requests_topic,
        republish_results_topic=settings.republish_results_topic,
        create_topics=False,
        http_port=0,
        relay_group_id=f"r-{uuid.uuid4().hex[:8]}",
        poll_interval_s=0.2,
        payload_schemas=TEST_SCHEMAS,
    )
    routes = parse_routes(settings.routes_file.read_text())
    lot = ParkingLot(client, settings.redis_key_prefix, settings.park_buckets)
    with ExitStack() as stack, psycopg.connect(url, autocommit=True) as conn:
        r, c = Relay(relay, Health()), ConsumerService(_consumer(settings), routes, Health())
        stack.enter_context(serving("relay", r.run, r.stop))
        stack.enter_context(serving("consumer", c.run, c.stop))
        sweeper = Sweeper(settings, routes, Health())
        sweeper.connect()
        stack.enter_context(serving("sweeper", sweeper.run, sweeper.stop))
        parked_at = None
        give_up = time.monotonic() + HEAL_WAIT_S
        while time.monotonic() < give_up:
            parked_at = parked_at or client.zscore(lot.index_key("ledger", "lost"), "lost")
            row = conn.execute(
                "SELECT resolved_at FROM inorder_gaps WHERE status = 'healed'"
            ).fetchone()
            if row and parked_at:
                return row[0].timestamp() - (parked_at + settings.gap_deadline_s)
            time.sleep(0.02)
        raise TimeoutError(f"the lost event was not healed within {HEAL_WAIT_S} s")


def run() -> list[BenchResult]:
    """Sweep cost at 100 and 100,000 parked entities; deadline-to-healed for one lost event."""
    prefix = f"bench.sweep.{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    with (
        temp_schema(os.environ["DATABASE_URL"], "bench_sweeper") as url,
        tempfile.TemporaryDirectory() as folder,
        _topics(os.environ["KAFKA_BOOTSTRAP_SERVERS"]) as topics,
    ):
        routes = Path(folder, "routes.toml")
        routes.write_text(ROUTES)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(step_handlers.TABLE)
        settings = _settings(url, routes, topics, prefix)
        sweeper = Sweeper(settings, parse_routes(ROUTES), Health())
        sweeper.connect()
        lot = ParkingLot(client, prefix, settings.park_buckets)
        small = _sweep_seconds(sweeper, client, lot, 100)
        large = _sweep_seconds(sweeper, client, lot, sized(100_000, 1_000))
        small = min(small, _sweep_seconds(sweeper, client, lot, 100))
        client.delete(*lot.index_keys("ledger"))
        sweeper.close()
        heal = _heal_seconds(settings, url, client)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.close()
    return [
        BenchResult("sweep_s_100_parked", small, "s", "one sweep, none overdue, best of 7"),
        BenchResult("sweep_s_100k_parked", large, "s", "one sweep, none overdue, best of 7"),
        BenchResult("sweep_ratio_100k_vs_100", large / small, "x", "goal <= 2"),
        BenchResult("gap_heal_s", heal, "s", "deadline to healed, one lost event"),
    ]
