"""A share group's terms: where it starts, how long a lock lasts, how many deliveries it allows.

A new share group starts at the latest offset, which would skip every event already in
the topic: inorder sets ``share.auto.offset.reset=earliest`` on the group through the
admin API before it joins (and the lock duration when ``INORDER_SHARE_RECORD_LOCK_MS``
says so), then reads the group's terms back. A principal that may not alter the
group's configuration gets one line naming what the group starts at and how to fix it;
the member joins anyway, since a group an operator set up already is what the line asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource

from schemas.runtime import kafka_clients

if TYPE_CHECKING:
    from consumer.settings import ConsumerSettings

log = structlog.get_logger(__name__)

# What Kafka ships: a 30 s acquisition lock and five deliveries.
DEFAULT_LOCK_MS = 30_000
DEFAULT_DELIVERY_LIMIT = 5
TIMEOUT_S = 15.0
# What the broker answers a principal that may not read or alter a group's configuration.
REFUSALS = frozenset(
    {
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)


@dataclass(frozen=True, slots=True)
class GroupTerms:
    """The terms a share group's records are acquired under."""

    lock_s: float = DEFAULT_LOCK_MS / 1000
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT
    start: str = "earliest"


def wanted(settings: ConsumerSettings) -> dict[str, str]:
    """The group configuration inorder sets: earliest start, and the lock if one is asked for."""
    configs = {"share.auto.offset.reset": "earliest"}
    if settings.share_record_lock_ms is not None:
        configs["share.record.lock.duration.ms"] = str(settings.share_record_lock_ms)
    return configs


def read_terms(values: dict[str, str]) -> GroupTerms:
    """The terms from the group's described configuration (Kafka's defaults where absent)."""

    def number(name: str, default: int) -> int:
        try:
            return int(values.get(name) or default)
        except ValueError:
            return default

    return GroupTerms(
        lock_s=number("share.record.lock.duration.ms", DEFAULT_LOCK_MS) / 1000,
        delivery_limit=number("share.delivery.count.limit", DEFAULT_DELIVERY_LIMIT),
        start=values.get("share.auto.offset.reset") or "latest",
    )


def configure(settings: ConsumerSettings, group: str) -> GroupTerms:
    """Set what inorder needs on the group, read its terms back; one line if it may not."""
    admin = AdminClient(kafka_clients.admin_config(settings, "inorder-consumer"))
    configs = wanted(settings)
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = ConfigResource("GROUP", group, incremental_configs=entries)
    refused = None
    try:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() not in REFUSALS:
            raise
        refused = str(exc.args[0])
    values: dict[str, str] = {}
    try:
        for future in admin.describe_configs([ConfigResource("GROUP", group)]).values():
            described = future.result(timeout=TIMEOUT_S)
            values = {name: entry.value for name, entry in described.items()}
    except KafkaException as exc:
        if exc.args[0].code() not in REFUSALS:
            raise  # Kafka down: the loop waits it out
        refused = refused or str(exc.args[0])
        values = {"share.auto.offset.reset": "unknown"}
    terms = read_terms(values)
    if refused is not None:
        log.warning(
            "share_group_not_configured",
            group=group,
            starts_at=terms.start,
            error=refused,
            fix=f"let this principal alter group {group}'s configuration, or set "
            + ", ".join(f"{k}={v}" for k, v in configs.items())
            + " on the group with kafka-configs",
        )
    if terms.start == "latest":
        log.error(
            "share_group_starts_latest",
            group=group,
            detail="events already in the topic when the group first joins are skipped",
        )
    log.info(
        "share_group_terms",
        group=group,
        lock_s=terms.lock_s,
        delivery_limit=terms.delivery_limit,
        start=terms.start,
    )
    return terms
