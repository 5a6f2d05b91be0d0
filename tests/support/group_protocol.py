"""The group protocol the tests' consumers join by: classic, or KIP-848's on request.

``INORDER_TEST_GROUP_PROTOCOL=consumer`` runs the suites that build their settings here
(the consumer's and the relay's) on the consumer group protocol. A test that shortened
its session through ``session.timeout.ms`` gets the same on the group instead, set
through the admin API, since the new protocol keeps timeouts on the broker.
"""

from __future__ import annotations

import os
from typing import Any

from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from schemas.runtime.kafka_settings import CLASSIC_ONLY

PROTOCOL = os.environ.get("INORDER_TEST_GROUP_PROTOCOL", "classic")


def on_protocol(values: dict[str, Any], bootstrap: str, group: str) -> dict[str, Any]:
    """``values`` (settings) for the protocol under test; the group's timeouts set for it."""
    if PROTOCOL != "consumer":
        return values
    extra = dict(values.get("kafka_extra") or {})
    session = extra.get("session.timeout.ms")
    values = {
        **values,
        "kafka_group_protocol": "consumer",
        "kafka_extra": {k: v for k, v in extra.items() if k not in CLASSIC_ONLY},
    }
    if session is not None:
        group_timeouts(bootstrap, group, int(session))
    return values


def group_timeouts(bootstrap: str, group: str, session_ms: int) -> None:
    """Set a consumer-protocol group's session timeout (and a heartbeat that fits it)."""
    heartbeat = max(1000, session_ms // 3)
    group_configs(
        bootstrap,
        group,
        {
            "consumer.session.timeout.ms": str(session_ms),
            "consumer.heartbeat.interval.ms": str(heartbeat),
        },
    )


def group_configs(bootstrap: str, group: str, configs: dict[str, str]) -> None:
    """Set a group's configuration through the admin API (before its first member joins)."""
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("GROUP", group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
