"""The group protocol: classic with its assignor, or KIP-848's consumer protocol, chosen once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.errors import OperatorError
from schemas.runtime import kafka_clients
from schemas.runtime.causes import Cause, cause
from schemas.runtime.kafka_settings import CLASSIC_ONLY, KafkaClientSettings
from tests.support.services import ROOT


def _settings(**values: object) -> KafkaClientSettings:
    return KafkaClientSettings(KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", **values)  # type: ignore[arg-type]


def test_classic_consumers_keep_the_assignor_the_program_chose() -> None:
    """Under the classic protocol the program's assignor is set and no group.protocol is."""
    config = kafka_clients.consumer_config(_settings(), "c", "g", assignor="cooperative-sticky")
    assert config["partition.assignment.strategy"] == "cooperative-sticky"
    assert "group.protocol" not in config


@pytest.mark.parametrize(
    "values",
    [
        {"kafka_group_protocol": "consumer"},
        {"kafka_extra": {"group.protocol": "consumer"}},
        {"kafka_extra": {"group.protocol": "CONSUMER"}},
    ],
)
def test_the_consumer_protocol_drops_the_assignor_from_setting_or_extra(
    values: dict[str, object],
) -> None:
    """Asked for by setting or by INORDER_KAFKA_EXTRA, no client-side assignor is set."""
    config = kafka_clients.consumer_config(
        _settings(**values), "c", "g", assignor="cooperative-sticky"
    )
    assert config["group.protocol"] == "consumer"
    assert not set(CLASSIC_ONLY) & set(config)


def test_the_broker_assignor_is_named_only_under_the_consumer_protocol() -> None:
    """group.remote.assignor goes to consumers of the new protocol and to no producer."""
    settings = _settings(kafka_group_protocol="consumer", kafka_group_remote_assignor="range")
    assert kafka_clients.consumer_config(settings, "c", "g")["group.remote.assignor"] == "range"
    producer = kafka_clients.producer_config(settings, "p")
    assert "group.remote.assignor" not in producer
    assert "group.protocol" not in producer


@pytest.mark.parametrize("name", CLASSIC_ONLY)
def test_a_classic_only_property_with_the_consumer_protocol_is_one_line(name: str) -> None:
    """A property the new protocol refuses stops settings with the fix, never a retry loop."""
    with pytest.raises(ValidationError) as raised:
        _settings(kafka_group_protocol="consumer", kafka_extra={name: "6000"})
    assert name in str(raised.value)
    assert "classic protocol" in str(raised.value)


def test_a_remote_assignor_without_the_consumer_protocol_is_refused() -> None:
    """INORDER_KAFKA_GROUP_REMOTE_ASSIGNOR alone says what to set with it."""
    with pytest.raises(ValidationError, match="INORDER_KAFKA_GROUP_PROTOCOL=consumer"):
        _settings(kafka_group_remote_assignor="uniform")


def test_a_configuration_librdkafka_refuses_is_the_operators_to_fix() -> None:
    """What librdkafka refuses at creation is an OperatorError (one line, exit), not an outage."""
    settings = _settings(kafka_extra={"fetch.wait.max.ms": "not-a-number"})
    with pytest.raises(kafka_clients.ClientConfigError) as raised:
        kafka_clients.consumer(settings, "c", "g")
    assert isinstance(raised.value, OperatorError)
    assert cause(raised.value) is Cause.OPERATOR
    assert "fetch.wait.max.ms" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_share_member_that_is_given_a_session_timeout_is_refused_in_one_line() -> None:
    """A share consumer takes no session.timeout.ms (the group has it): said, not retried."""
    with pytest.raises(kafka_clients.ClientConfigError, match=r"session\.timeout\.ms"):
        kafka_clients.share_consumer(
            _settings(kafka_extra={"session.timeout.ms": "6000"}), "c", "g"
        )


@pytest.mark.parametrize(
    ("program", "extra"),
    [
        ("consumer", {"INORDER_KAFKA_GROUP_PROTOCOL": "consumer"}),
        ("outbox_relay", {"INORDER_KAFKA_GROUP_PROTOCOL": "consumer"}),
        ("consumer", {"INORDER_CONSUMER_MODE": "share"}),
    ],
)
def test_a_program_given_a_property_its_group_refuses_stops_with_one_line(
    tmp_path: Path, program: str, extra: dict[str, str]
) -> None:
    """session.timeout.ms beside the consumer protocol or a share group: exit 2, one line."""
    routes = tmp_path / "routes.toml"
    routes.write_text('[[route]]\nstream = "x"\nkind = "projection"\ntable = "x"\nkey = "id"\n')
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": "postgresql://inorder@127.0.0.1:1/inorder",
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "INORDER_ROUTES_FILE": str(routes),
        "INORDER_KAFKA_EXTRA": '{"session.timeout.ms": "6000"}',
        **extra,
    }
    done = subprocess.run(
        [sys.executable, "-m", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "session.timeout.ms" in lines[0]
