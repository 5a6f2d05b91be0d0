"""Every Kafka client the programs make comes from one factory, with inorder's guarantees."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from schemas.runtime import kafka_clients
from schemas.runtime.kafka_settings import KafkaClientSettings
from tests.support.services import ROOT

PACKAGES = ("schemas", "producer", "outbox_relay", "consumer")
FACTORY = ROOT / "schemas" / "runtime" / "kafka_clients.py"


def _settings(extra: dict[str, str]) -> KafkaClientSettings:
    return KafkaClientSettings(KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", kafka_extra=extra)


@pytest.mark.parametrize(
    "extra",
    [{}, {"enable.idempotence": "false", "acks": "1"}, {"acks": "0", "linger.ms": "50"}],
)
def test_every_producer_is_idempotent_with_acks_all(extra: dict[str, str]) -> None:
    """Whatever INORDER_KAFKA_EXTRA or the program asks, a producer keeps both guarantees."""
    config = kafka_clients.producer_config(
        _settings(extra), "p", fixed={"acks": "1", "enable.idempotence": False}
    )
    assert (config["enable.idempotence"], config["acks"]) == (True, "all")
    assert config["client.id"] == "p"


def test_every_consumer_commits_itself_from_the_earliest_offset() -> None:
    """No consumer auto-commits or starts a new group at the latest offset, skipping events."""
    extra = {"enable.auto.commit": "true", "auto.offset.reset": "latest"}
    config = kafka_clients.consumer_config(_settings(extra), "c", "g")
    assert config["enable.auto.commit"] is False
    assert config["auto.offset.reset"] == "earliest"
    assert config["group.id"] == "g"


def test_tunables_yield_to_the_operator_and_fixed_settings_do_not() -> None:
    """INORDER_KAFKA_EXTRA changes a program's tunable, never what it fixed for its own use."""
    extra = {"fetch.wait.max.ms": "500", "linger.ms": "20"}
    config = kafka_clients.consumer_config(
        _settings(extra),
        "c",
        "g",
        tunables={"fetch.wait.max.ms": 100},
        fixed={"linger.ms": 0},
    )
    assert config["fetch.wait.max.ms"] == "500"
    assert config["linger.ms"] == 0


def _constructions(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in {"Producer", "Consumer"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_program_builds_a_kafka_client_by_hand() -> None:
    """Producers and consumers are made only by the factory, so each has the guarantees."""
    by_hand = [
        where
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != FACTORY
        for where in _constructions(path)
    ]
    assert by_hand == []
    assert _constructions(FACTORY), "the factory itself makes them"
