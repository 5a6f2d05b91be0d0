"""Broker loss and Redis failover under load, on three Kafka nodes and a Redis Cluster.

Each test runs the whole pipeline (relay, two consumers, sweeper) with projections
and a step route that parks, kills part of the cluster with SIGKILL while the load
runs, restarts it, waits for the pipeline to settle and judges it as the fault
suite does: nothing lost, nothing applied twice, totals equal, the audit clean.
"""

from __future__ import annotations

import time

import pytest

from consumer.kinds.steps.parking import ParkingLot
from tests.cluster.conftest import report
from tests.cluster.control import ClusterControl
from tests.faults.conftest import Scale
from tests.faults.pipeline import STEP_STREAM, Load, Pipeline
from tests.faults.test_faults import STANDARD, start

pytestmark = [pytest.mark.cluster, pytest.mark.services, pytest.mark.timeout(600)]

LOST_ENTITIES = [f"cluster-lost-{i}" for i in range(6)]


def _under_load(pipeline: Pipeline, scale: Scale) -> Load:
    start(pipeline, *STANDARD)
    load = pipeline.load(scale.entities, scale.ops_per_entity, scale.rate)
    pipeline.wait_for("load under way", lambda: load.written > scale.entities * 2)
    return load


def _park_some(pipeline: Pipeline) -> None:
    """Lose one event of each of a few entities, so their next events wait parked."""
    for entity in LOST_ENTITIES:
        pipeline.lose_one_event(entity)
    pipeline.wait_for("events parked", lambda: pipeline.parked() >= 1)


def _parked_key(pipeline: Pipeline, cluster: ClusterControl) -> tuple[str, str]:
    """A lost entity with something parked now, and its parked set's key."""
    lot = ParkingLot(cluster.redis, pipeline.prefix)
    for entity in LOST_ENTITIES:
        if lot.parked_seqs(STEP_STREAM, entity):
            return entity, lot.entity_key(STEP_STREAM, entity)
    raise AssertionError("nothing of the lost entities is parked")


def _on_master(pipeline: Pipeline, cluster: ClusterControl, master: int) -> list[str]:
    """The lost entities whose parked sets live on Redis node ``master`` now."""
    lot = ParkingLot(cluster.redis, pipeline.prefix)
    return [e for e in LOST_ENTITIES if cluster.master_of(lot.entity_key(STEP_STREAM, e)) == master]


def _forget_parks(pipeline: Pipeline, cluster: ClusterControl, entities: list[str]) -> None:
    """Drop what the promoted replica holds of these entities' parks.

    Replication is asynchronous: a replica promoted after a crash may lack the last
    parks its master acknowledged. On loopback it rarely does, so the test removes
    them, and the sweeper must find each such entity from its park mark in PostgreSQL
    and have the range republished from the outbox.
    """
    lot = ParkingLot(cluster.redis, pipeline.prefix)
    lot.remove(STEP_STREAM, lot.fetch(STEP_STREAM, entities, 1000))


def _settle_and_judge(
    pipeline: Pipeline, load: Load, fault: str, injected_at: float, failover_s: float
) -> None:
    load.join()
    pipeline.settle(timeout=240)
    repaired_s = time.monotonic() - injected_at
    with pipeline.db.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM inorder_gaps WHERE event_type = 'lost_park'"
        ).fetchone()
    verdict = pipeline.verdict()
    report(fault, verdict, int(row[0]) if row else 0, failover_s, repaired_s)
    assert verdict.clean, f"{fault}: {verdict}; logs in {pipeline.logs}"


def _broker_gone(cluster: ClusterControl, node: int, topic: str) -> bool:
    """Every partition of ``topic`` has a leader other than ``node``."""
    meta = cluster.admin.list_topics(topic, timeout=5).topics[topic]
    return all(p.leader not in (node, -1) for p in meta.partitions.values())


def test_broker_leading_most_partitions_killed_under_load(
    pipeline: Pipeline, cluster: ClusterControl, scale: Scale
) -> None:
    """SIGKILL of the busiest broker, restarted 5 s later: nothing lost or doubled."""
    load = _under_load(pipeline, scale)
    node = cluster.busiest_broker()
    cluster.kill_broker(node)
    injected_at = time.monotonic()
    pipeline.wait_for(
        "leaders moved", lambda: _broker_gone(cluster, node, pipeline.events_topic), 60
    )
    failover_s = time.monotonic() - injected_at
    time.sleep(max(0.0, 5 - failover_s))
    cluster.restart("kafka_cluster")
    _settle_and_judge(pipeline, load, f"kafka broker {node} kill -9", injected_at, failover_s)


def test_redis_master_killed_while_events_are_parked(
    pipeline: Pipeline, cluster: ClusterControl, scale: Scale
) -> None:
    """SIGKILL of the master holding parked events; its replica takes over; parks it lacks
    are found from their marks and republished; nothing lost or doubled."""
    load = _under_load(pipeline, scale)
    _park_some(pipeline)
    _, key = _parked_key(pipeline, cluster)
    master = cluster.master_of(key)
    entities = _on_master(pipeline, cluster, master)
    cluster.kill_redis(master)
    injected_at = time.monotonic()
    failover_s = cluster.promoted(master, key)
    _forget_parks(pipeline, cluster, entities)
    cluster.restart("redis_cluster")
    _settle_and_judge(pipeline, load, f"redis master {master} kill -9", injected_at, failover_s)


def test_broker_and_redis_master_killed_together_then_both_restarted(
    pipeline: Pipeline, cluster: ClusterControl, scale: Scale
) -> None:
    """The busiest broker and a master with parked events die at once; both come back."""
    load = _under_load(pipeline, scale)
    _park_some(pipeline)
    _, key = _parked_key(pipeline, cluster)
    master, node = cluster.master_of(key), cluster.busiest_broker()
    cluster.kill_broker(node)
    cluster.kill_redis(master)
    injected_at = time.monotonic()
    failover_s = cluster.promoted(master, key)
    time.sleep(max(0.0, 5 - failover_s))
    cluster.restart("kafka_cluster", "redis_cluster")
    _settle_and_judge(
        pipeline, load, f"broker {node} + redis master {master}", injected_at, failover_s
    )
