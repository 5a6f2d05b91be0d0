"""Typed settings of ``inorder-consumer``, the sweeper and ``inorder-admin``, read at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from consumer.kinds.steps.settings import StepSettings
from schemas import DEFAULT_TOPICS, MAX_MESSAGE_BYTES
from schemas.runtime.config import (
    RepairTimingSettings,
    ServiceSettings,
)
from schemas.runtime.debezium import DebeziumSettings
from schemas.runtime.kafka_settings import KafkaClientSettings
from schemas.runtime.payloads import PayloadSchemaSettings
from schemas.runtime.reading import Reading
from schemas.runtime.urls import OptionalPostgresUrl, PostgresUrl, RedisUrl


class RouteSettings(
    KafkaClientSettings, PayloadSchemaSettings, DebeziumSettings, StepSettings, ServiceSettings
):
    """What every program that runs the routes reads: the consumer, the sweeper, the admin.

    The addresses and the routes file are required. The route kinds' own process settings
    are composed in (``Kind.process``): the step kind's parking and lanes. A kind from
    elsewhere reads its own from the environment (``Resources.part``).
    """

    renamed: ClassVar[Mapping[str, str]] = {
        "INORDER_BATCH_SIZE": "INORDER_POLL_MAX_MESSAGES",
        "INORDER_BATCH_LINGER_MS": "INORDER_POLL_LINGER_MS",
    }

    database_url: PostgresUrl
    routes_file: Path = Field(
        description="The routes file (TOML): which route kind each entity stream gets"
    )
    topics: list[str] = Field(
        default_factory=lambda: [DEFAULT_TOPICS.events],
        min_length=1,
        description="Topics to consume, as a JSON list",
    )
    debezium_topics: list[str] = Field(
        default_factory=list,
        description="Topics Debezium's outbox event router writes, as a JSON list: consumed "
        "beside INORDER_TOPICS, each message read as the router writes it (the "
        "INORDER_DEBEZIUM_* settings say where inorder's fields are)",
    )
    dead_letter_topic: str = Field(
        default=DEFAULT_TOPICS.dead_letters, description="Where malformed events go, with why"
    )
    redis_url: RedisUrl
    redis_key_prefix: str = Field(
        default="inorder",
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Prefix of every parking key in Redis",
    )
    held_topic: str = Field(
        default=DEFAULT_TOPICS.held, description="Events refused by a full parking set go here"
    )
    max_message_bytes: int = Field(
        default=MAX_MESSAGE_BYTES,
        ge=1024,
        description="Larger values are dead-lettered as too large",
    )
    dead_letter_max_value_bytes: int = Field(
        default=MAX_MESSAGE_BYTES,
        ge=1024,
        description="Dead-letter copies are cut to this size; the original stays in its topic",
    )
    create_topics: bool = Field(
        default=True, description="Create missing topics this process writes at start-up"
    )
    http_port: int = Field(
        default=9401, ge=0, le=65535, description="Port of /healthz, /readyz and /metrics"
    )

    def reading(self) -> Reading:
        """How messages are read into events: the largest, and Debezium's topics and shape."""
        return Reading(self.max_message_bytes, self.debezium_topics, self.debezium_shape())


class ConsumerSettings(RouteSettings):
    """The consumer's own: its group and how it takes poll batches."""

    group_id: str = Field(
        default="inorder-consumer",
        description="Kafka consumer group; a second deployment side by side needs its own",
    )
    poll_max_messages: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Most messages in one poll batch; a poll batch is what has already "
        "arrived, so a quiet topic is applied event by event and a backlog in batches of this "
        "size (INORDER_BATCH_SIZE before 0.2.0)",
    )
    poll_timeout_ms: int = Field(
        default=100,
        ge=1,
        le=60_000,
        description="How long one poll blocks while nothing has arrived; it paces only an idle "
        "consumer's dependency checks, never an event that is there",
    )
    commit_interval_ms: int = Field(
        default=100,
        ge=0,
        le=60_000,
        description="Offsets of applied batches go to Kafka at most this often, and whenever "
        "the consumer falls idle (0: after every batch); a commit lost in a crash only means "
        "a redelivery, which changes nothing",
    )
    poll_linger_ms: int = Field(
        default=0,
        ge=0,
        le=60_000,
        description="0: apply what has arrived at once; above 0, after its first message a "
        "poll batch waits up to this long to fill (INORDER_BATCH_LINGER_MS before 0.2.0)",
    )
    consumer_mode: Literal["group", "share"] = Field(
        default="group",
        description="`group`: a consumer group (classic or consumer protocol, "
        "INORDER_KAFKA_GROUP_PROTOCOL), each partition read by one member; `share`: a share "
        "group (Kafka 4.2 or newer), every member reads every partition and acknowledges "
        "each record (experimental: the client's share consumer is a preview)",
    )
    share_max_poll_records: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Share mode: most records one member acquires per poll; fewer spread a "
        "topic over more members",
    )
    share_record_lock_ms: int | None = Field(
        default=None,
        ge=1000,
        le=3_600_000,
        description="Share mode: the group's acquisition lock (share.record.lock.duration.ms), "
        "set through the admin API at start; unset: the group's or broker's (30 s by default)",
    )
    share_lock_margin_ms: int = Field(
        default=5000,
        ge=500,
        le=600_000,
        description="Share mode: a record not applied this long before its lock runs out is "
        "released (on its last delivery: dead-lettered) instead of left to expire",
    )
    poll_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024 * 1024,
        description="Most memory the events of one part of a poll batch may take once decoded "
        "(estimated from each value's length and its JSON nodes); a larger batch is decoded "
        "and applied in parts, in order",
    )

    @model_validator(mode="after")
    def _share_can_work(self) -> Self:
        if self.consumer_mode != "share":
            return self
        refused = self.classic_only()
        if refused:
            raise ValueError(
                f"INORDER_KAFKA_EXTRA sets {', '.join(refused)}, which a share group member "
                "does not take (the group's configuration has it): remove it"
            )
        lock = self.share_record_lock_ms
        if lock is not None and self.share_lock_margin_ms * 2 > lock:
            raise ValueError(
                "INORDER_SHARE_LOCK_MARGIN_MS must be at most half of INORDER_SHARE_RECORD_LOCK_MS"
            )
        return self


class SweeperSettings(RouteSettings, RepairTimingSettings):
    """The routes' settings plus the sweeper's own; ``inorder-admin`` reads the same."""

    republish_requests_topic: str = Field(
        default=DEFAULT_TOPICS.republish_requests, description="Where republish requests go"
    )
    republish_results_topic: str = Field(
        default=DEFAULT_TOPICS.republish_results, description="Where the relay answers them"
    )
    # Its own default port, so a sweeper runs beside a consumer on one host.
    http_port: int = Field(
        default=9402, ge=0, le=65535, description="Port of /healthz, /readyz and /metrics"
    )
    sweeper_group_id: str = Field(
        default="inorder-sweeper",
        description="Consumer group reading the relay's answers; a second deployment side by "
        "side needs its own",
    )
    outbox_database_url: OptionalPostgresUrl = Field(
        default=None,
        description="The producer's database, when the outbox is not in DATABASE_URL (audit, "
        "explain and the stall check read it)",
    )
    sweep_interval_s: float = Field(
        default=5.0, gt=0, description="How often the active sweeper looks for overdue gaps"
    )
    lease_ttl_s: float = Field(
        default=15.0,
        gt=0,
        description="A sweeper that stops renewing loses the lease after this long; a standby "
        "takes over",
    )
    history_retention_s: float = Field(
        default=30 * 86_400,
        ge=0,
        description="The consumer's history older than this is deleted by the active sweeper: "
        "steps applied, calls finished, failures of applied steps, resolved gaps, letters "
        "decided, held copies sent back (30 days); open work and progress are kept; 0 keeps all",
    )
    history_interval_s: float = Field(
        default=600.0, gt=0, description="How often the active sweeper deletes old history"
    )
    history_batch_rows: int = Field(
        default=1_000, ge=1, description="Most history rows deleted per table in one pass"
    )
    gauge_interval_s: float = Field(
        default=15.0,
        gt=0,
        description="How often the parked-events, gaps and batch gauges are recomputed (parked "
        "events are read from counters the parks keep: two reads per bucket)",
    )
    max_overdue_per_sweep: int = Field(
        default=1000,
        ge=1,
        description="Overdue entities handled per route and sweep; the rest wait for the next",
    )
