"""Typed settings: one line per mistake, naming the variable, never showing a secret."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from consumer.settings import ConsumerSettings, SweeperSettings
from outbox_relay.settings import RelaySettings
from schemas.runtime.config import (
    RepairTimingSettings,
    describe,
    load_or_exit,
    renamed_in,
)
from schemas.runtime.kafka_settings import KafkaClientSettings
from schemas.runtime.urls import PostgresUrl


class _Db(KafkaClientSettings):
    database_url: PostgresUrl


def _problem(cls: type) -> str:
    with pytest.raises(ValidationError) as caught:
        cls()
    return describe(caught.value, cls)


def test_missing_settings_are_named_by_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing required settings are listed by the environment variable to set."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    assert _problem(_Db) == "KAFKA_BOOTSTRAP_SERVERS: Field required; DATABASE_URL: Field required"


def test_secret_values_are_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad secret setting is named, but its value is hidden."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("DATABASE_URL", "mysql://user:hunter2@db/x")
    line = _problem(_Db)
    assert "hunter2" not in line
    assert line == (
        "DATABASE_URL: must be a postgresql:// URL, e.g. postgresql://user@host:5432/db "
        "(value hidden)"
    )


def test_bad_values_show_what_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-secret bad value is shown with the prefixed variable name."""
    monkeypatch.setenv("INORDER_GAP_DEADLINE_S", "-5")
    assert _problem(RepairTimingSettings) == (
        "INORDER_GAP_DEADLINE_S: Input should be greater than 0 (got '-5')"
    )


def test_sasl_needs_its_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """SASL without mechanism, user and password is refused with what to set."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    assert "INORDER_KAFKA_SASL_MECHANISM" in _problem(KafkaClientSettings)


def test_kafka_config_passes_security_and_extra_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """Security settings and INORDER_KAFKA_EXTRA reach librdkafka; explicit ones win."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "b1:9093")
    monkeypatch.setenv("INORDER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("INORDER_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("INORDER_KAFKA_SASL_USERNAME", "relay")
    monkeypatch.setenv("INORDER_KAFKA_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv(
        "INORDER_KAFKA_EXTRA", '{"client.rack": "az1", "bootstrap.servers": "ignored"}'
    )
    assert KafkaClientSettings().kafka_config() == {
        "bootstrap.servers": "b1:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "relay",
        "sasl.password": "s3cret",
        "client.rack": "az1",
    }


def test_json_setting_that_does_not_parse_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A JSON setting that does not parse stops with one line, naming it, hiding its value."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/x")
    monkeypatch.setenv("INORDER_KAFKA_EXTRA", '{"sasl.password": "hunter2"')
    with pytest.raises(SystemExit) as stopped:
        load_or_exit(_Db, "prog")
    assert stopped.value.code == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1
    assert line.startswith("prog: bad configuration: INORDER_KAFKA_EXTRA: not valid JSON")
    assert "hunter2" not in line


def test_kafka_extra_values_are_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka_extra may carry credentials: a bad value is named but not shown."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/x")
    monkeypatch.setenv("INORDER_KAFKA_EXTRA", '{"sasl.password": "hunter2", "n": 5}')
    line = _problem(_Db)
    assert "hunter2" not in line
    assert line.startswith("INORDER_KAFKA_EXTRA:")


def test_database_port_must_be_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DATABASE_URL whose port is not a number is refused at start, not retried forever."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:hunter2@h:five/x")
    line = _problem(_Db)
    assert line == (
        "DATABASE_URL: the port after host: must be a number from 1 to 65535 (value hidden)"
    )


def test_every_renamed_variable_set_is_named_with_its_new_name() -> None:
    """Old names set are all named on one line with what to set; names not set say nothing."""
    both = {"INORDER_BATCH_SIZE": "10", "INORDER_BATCH_LINGER_MS": "5"}
    assert renamed_in(ConsumerSettings, both) == (
        "INORDER_BATCH_LINGER_MS was renamed: set INORDER_POLL_LINGER_MS instead; "
        "INORDER_BATCH_SIZE was renamed: set INORDER_POLL_MAX_MESSAGES instead"
    )
    assert renamed_in(SweeperSettings, both) == renamed_in(ConsumerSettings, both)
    assert renamed_in(RelaySettings, both) == (
        "INORDER_BATCH_SIZE was renamed: set INORDER_READ_ROWS instead"
    )
    assert renamed_in(RelaySettings, {"INORDER_READ_ROWS": "10"}) is None


def test_a_renamed_variable_stops_start_up_before_anything_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Even with required settings missing, the old name is what the one line names."""
    monkeypatch.setenv("INORDER_BATCH_SIZE", "10")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as stopped:
        load_or_exit(RelaySettings, "inorder-relay")
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "inorder-relay: bad configuration: INORDER_BATCH_SIZE was renamed: "
        "set INORDER_READ_ROWS instead\n"
    )
