"""Typed settings of ``inorder-relay``, read from the environment only at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from schemas import DEFAULT_TOPICS, MAX_MESSAGE_BYTES
from schemas.runtime.config import (
    RepairTimingSettings,
    ServiceSettings,
)
from schemas.runtime.debezium import DebeziumSettings
from schemas.runtime.kafka_settings import KafkaClientSettings
from schemas.runtime.payloads import PayloadSchemaSettings
from schemas.runtime.urls import PostgresUrl


class RelaySettings(
    KafkaClientSettings,
    RepairTimingSettings,
    PayloadSchemaSettings,
    DebeziumSettings,
    ServiceSettings,
):
    """Everything the relay needs; every field has a default but the two addresses."""

    renamed: ClassVar[Mapping[str, str]] = {"INORDER_BATCH_SIZE": "INORDER_READ_ROWS"}

    database_url: PostgresUrl
    relay_role: Literal["publish", "republish_only"] = Field(
        default="publish",
        description="`publish`: publish inorder's outbox and answer republish requests from "
        "it. `republish_only`: answer republish requests from a Debezium outbox table "
        "(INORDER_DEBEZIUM_TABLE) with messages as Debezium's outbox event router writes them, "
        "and publish nothing (Debezium does)",
    )
    read_rows: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description="Most rows one read takes per slice and part (past the cursor, per "
        "remembered transaction); INORDER_BATCH_SIZE before 0.2.0",
    )
    read_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        le=2**40,
        description="Most bytes of row text (payloads, headers, names) one read loads, shared "
        "by the slices it reads; each slice still takes its first row. The relay holds at "
        "most two reads at a time (one read ahead)",
    )
    envelope: Literal["inorder", "cloudevents"] = Field(
        default="inorder",
        description="How events go to Kafka: `inorder` (the JSON envelope) or `cloudevents` "
        "(CloudEvents binary mode: the payload as the value, the attributes as `ce_` headers); "
        "the consumers read both",
    )
    lease_s: float = Field(
        default=10.0,
        ge=1,
        le=600,
        description="How long a relay holds its slices without renewing; a standby takes an "
        "expired slice over within this time of its relay stopping",
    )
    poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=600,
        description="Fallback poll when no NOTIFY arrives (missed notifications, other writers)",
    )
    delivery_timeout_ms: int = Field(
        default=30_000,
        ge=1_000,
        description="How long librdkafka may try to deliver one message (`message.timeout.ms`)",
    )
    retention_s: float = Field(
        default=8 * 86_400,
        gt=0,
        description="Sent rows created longer ago than this are deleted (8 days); it must "
        "outlive the worst-case gap repair, and the sweeper checks it outlives the longest "
        "park (a step route's park_ttl_s, 7 days by default) plus that repair",
    )
    purge_interval_s: float = Field(default=60.0, gt=0, description="How often retention runs")
    purge_batch_rows: int = Field(
        default=1_000, ge=1, description="Rows one retention delete statement looks at"
    )
    republish_cooldown_s: float = Field(
        default=30.0,
        ge=0,
        description="The same republish range asked again within this window re-sends nothing",
    )
    republish_requests_topic: str = Field(
        default=DEFAULT_TOPICS.republish_requests, description="Where republish requests arrive"
    )
    republish_results_topic: str = Field(
        default=DEFAULT_TOPICS.republish_results, description="Where the relay answers them"
    )
    relay_group_id: str = Field(
        default="inorder-relay",
        description="Consumer group reading republish requests; a second deployment side by "
        "side needs its own",
    )
    max_message_bytes: int = Field(
        default=MAX_MESSAGE_BYTES,
        ge=1024,
        description="Rows whose message would be larger are marked failed instead of sent",
    )
    create_topics: bool = Field(
        default=True, description="Create the republish topics at start-up when missing"
    )
    unknown_topic_grace_s: float = Field(
        default=120.0,
        ge=0,
        le=86_400,
        description="How long a row naming a topic the cluster does not have stays set aside "
        "(its slice goes on) before it is marked failed unknown_topic; either way it is sent "
        "by itself once the topic appears",
    )
    allowed_topics: list[str] | None = Field(
        default=None,
        description="Topics outbox rows may name, as a JSON list; unset: any topic that exists. "
        "A row naming another is marked failed",
    )
    http_port: int = Field(
        default=9400, ge=0, le=65535, description="Port of /healthz, /readyz and /metrics"
    )

    @model_validator(mode="after")
    def _retention_outlives_repairs(self) -> Self:
        worst = self.worst_case_repair_s()
        if self.retention_s <= worst:
            raise ValueError(
                f"INORDER_RETENTION_S={self.retention_s:g} is not longer than the worst-case gap "
                f"repair time of {worst:g}s (INORDER_GAP_DEADLINE_S plus the republish backoff): "
                "rows could be purged before a consumer asks for them again; raise the retention "
                "or shorten the repair settings"
            )
        return self
