"""A real Prometheus scraping a running consumer and sweeper sees the parked alert go pending."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import wait_until
from tests.support.services import ROOT, Services

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"


@contextmanager
def _process(argv: list[str], env: dict[str, str] | None, log: Path) -> Iterator[None]:
    with log.open("ab") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=sink)
    try:
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (http on loopback)
            return orjson.loads(response.read())
    except OSError:
        return None


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (http on loopback)
            return True
    except OSError:
        return False


def _alert_state(port: int, name: str) -> str | None:
    found = _get(f"http://127.0.0.1:{port}/api/v1/alerts")
    for alert in (found or {}).get("data", {}).get("alerts", []):
        if alert["labels"]["alertname"] == name:
            return str(alert["state"])
    return None


def test_prometheus_sees_the_parked_alert_go_pending(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Seq 1 of an entity is lost; 600 later events park, climbing; the alert goes pending."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("the prometheus binary is missing: `make test` installs the Debian package")
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    consumer_port, sweeper_port, prom_port = rs.free_port(), rs.free_port(), rs.free_port()
    # Republish requests go unanswered (no relay): keep the gap open through the test.
    env = {
        **sw.env(p),
        "INORDER_GROUP_ID": p.group_id,
        "INORDER_REPUBLISH_MAX_ATTEMPTS": "50",
    }
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "inorder-consumer",
                "static_configs": [{"targets": [f"127.0.0.1:{consumer_port}"]}],
            },
            {
                "job_name": "inorder-sweeper",
                "static_configs": [{"targets": [f"127.0.0.1:{sweeper_port}"]}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with ExitStack() as stack:
        for name, port in (("inorder-consumer", consumer_port), ("inorder-sweeper", sweeper_port)):
            stack.enter_context(
                _process(
                    [sw.tool(name)],
                    {**env, "INORDER_HTTP_PORT": str(port)},
                    tmp_path / f"{name}.log",
                )
            )
        stack.enter_context(
            _process(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                None,
                tmp_path / "prometheus.log",
            )
        )
        wait_until(lambda: _ok(f"http://127.0.0.1:{sweeper_port}/healthz"), 60)
        targets = f"http://127.0.0.1:{prom_port}/api/v1/targets"
        wait_until(
            lambda: (
                [
                    t["health"]
                    for t in (_get(targets) or {"data": {"activeTargets": []}})["data"][
                        "activeTargets"
                    ]
                ]
                == ["up", "up"]
            ),
            60,
        )
        assert _alert_state(prom_port, "InorderParkedEventsAccumulating") is None
        # Seq 1 never comes; the rest park, in two waves so the count visibly climbs.
        cs.send_events(
            services.kafka_bootstrap, p.topics.events, [ss.step(s) for s in range(2, 302)]
        )
        wait_until(lambda: _parked(prom_port) >= 300, 60)
        cs.send_events(
            services.kafka_bootstrap, p.topics.events, [ss.step(s) for s in range(302, 602)]
        )
        wait_until(
            lambda: _alert_state(prom_port, "InorderParkedEventsAccumulating") == "pending", 90
        )
        assert _parked(prom_port) == 600
        wait_until(lambda: _alert_state(prom_port, "InorderGapEscalated") == "firing", 60)


def _parked(port: int) -> float:
    found = _get(f"http://127.0.0.1:{port}/api/v1/query?query=max(events_parked_current)")
    result = (found or {}).get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else 0.0
