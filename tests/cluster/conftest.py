"""Fixtures of the cluster suite: the cluster itself, a pipeline per test, the report table.

Run by ``make test-cluster`` against ``deploy/local/stack up --cluster``; any other
environment fails the suite at once, naming the command to run. Each test adds a
row to the report printed at the end and written to ``cluster-report.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from redis.cluster import RedisCluster

from schemas.runtime.redis_client import connect as connect_redis
from tests.cluster.control import ClusterControl
from tests.conftest import PgSchema, TopicFactory
from tests.faults.conftest import SHORT, Scale
from tests.faults.pipeline import Pipeline
from tests.faults.verdict import Verdict
from tests.support.report import write_table
from tests.support.services import ROOT, Services

REPORT_FILE = ROOT / "cluster-report.json"


@dataclass(frozen=True)
class Row:
    """One line of the cluster report."""

    fault: str
    produced: int
    lost: int
    applied_twice: int
    totals_off: int
    unexplained: int
    parks_lost: int
    failover_s: float
    repaired_s: float


ROWS: list[Row] = []


@pytest.fixture(scope="session")
def scale() -> Scale:
    """The fault suite's short scale: the load runs while the fault lands."""
    return SHORT


@pytest.fixture(scope="session")
def cluster(services: Services) -> Iterator[ClusterControl]:
    """The local cluster; fails at once when the environment is not one."""
    brokers = AdminClient({"bootstrap.servers": services.kafka_bootstrap}).list_topics(timeout=10)
    client = connect_redis(services.redis_url)
    if len(brokers.brokers) != 3 or not isinstance(client, RedisCluster):
        client.close()
        pytest.fail(
            "the cluster suite needs the local cluster: deploy/local/stack up --cluster and "
            'eval "$(deploy/local/stack env --cluster)" (make test-cluster does both)'
        )
    yield ClusterControl(services.kafka_bootstrap, client)
    client.close()


@pytest.fixture
def pipeline(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> Iterator[Pipeline]:
    """A pipeline of this test's own; every process it started is stopped afterwards.

    Gaps wait 10 s before repair, so parked events are still parked when a test
    kills the Redis master that holds them.
    """
    made = Pipeline(pg_schema, services, topic_factory, tmp_path, INORDER_GAP_DEADLINE_S="10")
    yield made
    made.close()


def report(
    fault: str, verdict: Verdict, parks_lost: int, failover_s: float, repaired_s: float
) -> None:
    """Add one row to the report."""
    ROWS.append(
        Row(
            fault,
            verdict.produced,
            verdict.lost,
            verdict.applied_twice,
            verdict.totals_off,
            verdict.unexplained,
            parks_lost,
            round(failover_s, 1),
            round(repaired_s, 1),
        )
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the cluster report as a table and write it to cluster-report.json."""
    if not ROWS:
        return
    REPORT_FILE.write_text(json.dumps([asdict(r) for r in ROWS], indent=2) + "\n")
    headers = [name.replace("_", " ") for name in Row.__dataclass_fields__]
    write_table(
        terminalreporter, "cluster report", headers, [list(asdict(r).values()) for r in ROWS]
    )
    terminalreporter.write_line(f"written to {REPORT_FILE.name}")
