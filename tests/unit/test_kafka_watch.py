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
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "topic_authorization_failed"),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "cluster_authorization_failed"),
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


class _Queue:
    """A producer's flush as seen from outside: messages left after each call."""

    def __init__(self, left: list[int], refuse_at: int | None = None) -> None:
        self.left, self.refuse_at, self.calls = left, refuse_at, 0

    def flush(self, timeout: float) -> int:
        self.calls += 1
        if self.calls == self.refuse_at:
            kafka_watch.report(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, "refused"))
        return self.left.pop(0) if self.left else 0


def test_unsent_is_none_once_everything_is_delivered() -> None:
    """A queue that drains, however slowly, has nothing to say."""
    assert kafka_watch.unsent(_Queue([3, 1, 0]), 30) is None  # type: ignore[arg-type]


def test_unsent_names_a_refusal_at_once_rather_than_waiting_out_the_time() -> None:
    """A refused login stops the wait with its code, long before the time is up."""
    queue = _Queue([5] * 100, refuse_at=2)
    why = kafka_watch.unsent(queue, 30)  # type: ignore[arg-type]
    assert why is not None
    assert "sasl_authentication_failed" in why
    assert queue.calls == 2


def test_unsent_says_kafka_did_not_answer_when_time_runs_out() -> None:
    """No refusal, no delivery: the time is named."""
    why = kafka_watch.unsent(_Queue([1] * 10), 0.0)  # type: ignore[arg-type]
    assert why == "Kafka did not answer within 0 s"


class _Polled:
    """A polled message as a consumer returns it: a value, or an error instead."""

    def __init__(self, error: KafkaError | None = None) -> None:
        self._error = error

    def error(self) -> KafkaError | None:
        return self._error


def test_usable_keeps_the_messages_and_reports_the_errors_in_between() -> None:
    """Order kept; a refused topic among them is noted, the end of a partition is not."""
    first, second = _Polled(), _Polled()
    polled = [
        first,
        _Polled(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "refused")),
        _Polled(KafkaError(KafkaError._PARTITION_EOF, "end")),
        second,
    ]
    assert kafka_watch.usable(polled) == [first, second]  # type: ignore[arg-type]
    assert kafka_watch.problems() == {"kafka": "topic_authorization_failed"}
