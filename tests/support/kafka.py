"""Reading back what reached a topic, for assertions."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, Message


def drain(
    bootstrap: str,
    topic: str,
    *,
    expect: int | None = None,
    idle_s: float = 2.0,
    max_s: float = 60,
    client: Mapping[str, Any] | None = None,
) -> list[Message]:
    """Every message of ``topic`` from the start, read by a fresh group.

    Stops once ``expect`` messages arrived (then waits ``idle_s`` more for extras)
    or after ``idle_s`` with nothing new, and always within ``max_s``. ``client``: more
    librdkafka properties (a secured cluster's protocol and credentials).
    """
    config: dict[str, Any] = {
        **(client or {}),
        "bootstrap.servers": bootstrap,
        "group.id": f"drain-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    consumer = Consumer(config)
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + max_s
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = consumer.consume(num_messages=500, timeout=0.2)
            fresh = [m for m in batch if m.error() is None]
            got.extend(fresh)
            now = time.monotonic()
            if fresh:
                last_new = now
            reached = expect is not None and len(got) >= expect
            waited_long = now - last_new > (idle_s if reached or expect is None else max_s)
            if waited_long:
                break
    finally:
        consumer.close()
    return got


def wait_until(check: Any, timeout_s: float = 30.0, interval_s: float = 0.1) -> Any:
    """Call ``check`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s: {check}")
        time.sleep(interval_s)
