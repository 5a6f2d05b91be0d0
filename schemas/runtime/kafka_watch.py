"""What librdkafka reports outside any call: a refused login, a refused permission.

A client whose SASL password or certificate is refused does not fail a call: librdkafka
retries in its own threads and tells only its error callback. Every client made through
``schemas.runtime.kafka_clients`` reports there, so a process whose credentials Kafka
refuses says so on ``/readyz`` (``kafka: <code>``) for as long as the refusals go on,
and logs each kind of refusal once a minute, not once per retry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import structlog
from confluent_kafka import KafkaError, Message, Producer

from schemas.runtime.causes import Cause, kafka_cause

log = structlog.get_logger(__name__)

FRESH_S = 30.0  # a refusal older than this no longer makes the process unready
# Refused permissions the cause table gives to an input: a row naming a topic the relay
# may not write fails that row, but a reader refused its own topic here is the operator's.
_ALSO_REFUSED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED})
LOG_EVERY_S = 60.0

_lock = threading.Lock()
_refused: dict[str, float] = {}  # code -> when last reported (monotonic)
_logged: dict[str, float] = {}


def code_of(err: KafkaError) -> str:
    """A short code for ``/readyz``: the error's name, lower case."""
    return err.name().strip("_").lower() or "kafka_error"


def report(err: KafkaError) -> None:
    """librdkafka's error callback, and a consumer's error messages: note a refusal (the
    operator's to fix), log it. The end of a partition is no error and is passed over."""
    if err.code() == KafkaError._PARTITION_EOF:
        return
    now = time.monotonic()
    code = code_of(err)
    refused = kafka_cause(err.code()) is Cause.OPERATOR or err.code() in _ALSO_REFUSED
    with _lock:
        if refused:
            _refused[code] = now
        quiet = now - _logged.get(code, -LOG_EVERY_S) < LOG_EVERY_S
        if not quiet:
            _logged[code] = now
    if not quiet:
        level = log.error if refused else log.warning
        level("kafka_error", code=err.name(), detail=err.str())


def usable(messages: Iterable[Message]) -> list[Message]:
    """A consumer's poll without its error messages, each reported (``report``) first."""
    found = []
    for message in messages:
        failed = message.error()
        if failed is None:
            found.append(message)
        else:
            report(failed)
    return found


def problems() -> dict[str, str]:
    """``{"kafka": code}`` while Kafka has refused this process's credentials lately."""
    now = time.monotonic()
    with _lock:
        fresh = [code for code, at in _refused.items() if now - at < FRESH_S]
    return {"kafka": ", ".join(sorted(fresh))} if fresh else {}


def unsent(producer: Producer, timeout_s: float) -> str | None:
    """Flush ``producer``: None once every message is delivered, else why not.

    Stops early when Kafka refuses this process's login or a permission (librdkafka
    would retry until ``timeout_s``), naming the refusal's code; a command can then say
    why nothing went, not only that.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = producer.flush(max(0.0, min(1.0, deadline - time.monotonic())))
        if not left:
            return None
        refused = problems().get("kafka")
        if refused:
            return f"Kafka refused it ({refused}): check the credentials and ACLs"
        if time.monotonic() >= deadline:
            return f"Kafka did not answer within {timeout_s:g} s"


def forget() -> None:
    """Drop what was noted (tests)."""
    with _lock:
        _refused.clear()
        _logged.clear()
