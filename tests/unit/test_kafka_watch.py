"""Refusals librdkafka reports only to its error callback make the process unready."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog
from confluent_kafka import KafkaError

from schemas.runtime import kafka_watch
from schemas.runtime.health import Health


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    kafka_watch.forget()
    yield
    kafka_watch.forget()


@pytest.mark.parametrize(
    ("code", "named"),
    [
        (KafkaError._AUTHENTICATION, "authentication"),
        (KafkaError.SASL_AUTHENTICATION_FAILED, "sasl_authentication_failed"),
        (KafkaError._SSL, "ssl"),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, "group_authorization_failed"),
    ],
)
def test_a_refused_login_or_permission_makes_the_process_unready(code: int, named: str) -> None:
    """The code shows on /readyz's problems, beside what the process itself reported."""
    health = Health()
    health.cleared("starting")
    kafka_watch.report(KafkaError(code, "refused for user svc at host h"))
    assert health.problems == {"kafka": named}


def test_an_outage_is_logged_but_left_to_the_loops_that_wait_it_out() -> None:
    """A transport error or all brokers down: logged, no refusal noted."""
    kafka_watch.report(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    kafka_watch.report(KafkaError(KafkaError._ALL_BROKERS_DOWN, "down"))
    assert kafka_watch.problems() == {}


def test_the_end_of_a_partition_is_no_error() -> None:
    """A consumer's partition-EOF message is neither noted nor logged."""
    with structlog.testing.capture_logs() as logs:
        kafka_watch.report(KafkaError(KafkaError._PARTITION_EOF, "end"))
    assert logs == []
    assert kafka_watch.problems() == {}


def test_each_kind_of_error_is_logged_once_a_minute() -> None:
    """librdkafka repeats a refusal on every retry; the log has it once."""
    with structlog.testing.capture_logs() as logs:
        for _ in range(20):
            kafka_watch.report(KafkaError(KafkaError._AUTHENTICATION, "refused"))
        kafka_watch.report(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    assert [(e["event"], e["code"]) for e in logs] == [
        ("kafka_error", "_AUTHENTICATION"),
        ("kafka_error", "_TRANSPORT"),
    ]
