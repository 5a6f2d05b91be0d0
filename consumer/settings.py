"""Typed settings of ``inorder-consumer``, read from the environment only at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, AliasChoices, Field, SecretStr

from schemas import DEFAULT_TOPICS, MAX_MESSAGE_BYTES
from schemas.runtime.config import KafkaClientSettings, PostgresUrl, RepairTimingSettings


def _is_redis_url(value: SecretStr | None) -> SecretStr | None:
    if value is not None and not value.get_secret_value().startswith(("redis://", "rediss://")):
        raise ValueError("must be a redis:// or rediss:// URL, e.g. redis://host:6379/0")
    return value


# The REDIS_URL setting, kept secret (it may hold a password).
RedisUrl = Annotated[
    SecretStr | None,
    AfterValidator(_is_redis_url),
    Field(default=None, validation_alias=AliasChoices("REDIS_URL", "INORDER_REDIS_URL")),
]


class ConsumerSettings(KafkaClientSettings):
    """Everything the consumer needs; the addresses and the routes file are required."""

    # The consumer's own database, where projections and step progress live.
    database_url: PostgresUrl
    routes_file: Path
    # Topics to consume, as a JSON list.
    topics: list[str] = Field(default_factory=lambda: [DEFAULT_TOPICS.events], min_length=1)
    group_id: str = "inorder-consumer"
    dead_letter_topic: str = DEFAULT_TOPICS.dead_letters
    # Where parked events live; required when the routes file has a step route.
    redis_url: RedisUrl
    # Key prefix of every parking key in Redis.
    redis_key_prefix: str = Field(default="inorder", pattern=r"^[A-Za-z0-9_.:-]+$")
    # Start step routes on a Redis whose persistence cannot be read (a managed store).
    park_store_trusted: bool = False
    # Events refused by a full parking set go here, with the reason.
    held_topic: str = DEFAULT_TOPICS.held
    # Most messages applied in one batch. A batch is what has already arrived: a quiet
    # topic is applied event by event, a backlog in batches of this size.
    batch_size: int = Field(default=1000, ge=1, le=100_000)
    # How long one poll blocks while nothing at all has arrived; it paces only an idle
    # consumer's dependency checks, never an event that is there.
    poll_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    # 0: apply what has arrived at once. Above 0: after its first message, a batch waits up
    # to this long to fill to batch_size (100 is the fixed wait batches had before).
    batch_linger_ms: int = Field(default=0, ge=0, le=60_000)
    # Values larger are dead-lettered as too large (the codec's cap).
    max_message_bytes: int = Field(default=MAX_MESSAGE_BYTES, ge=1024)
    # Dead-letter copies are cut to this size; the original stays in its topic.
    dead_letter_max_value_bytes: int = Field(default=MAX_MESSAGE_BYTES, ge=1024)
    create_topics: bool = True
    topic_partitions: int = Field(default=6, ge=1)
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=9401, ge=0, le=65535)
    log_level: str = "INFO"


class SweeperSettings(ConsumerSettings, RepairTimingSettings):
    """The consumer's settings plus the sweeper's; ``inorder-admin`` reads the same."""

    republish_requests_topic: str = DEFAULT_TOPICS.republish_requests
    republish_results_topic: str = DEFAULT_TOPICS.republish_results
    sweeper_group_id: str = "inorder-sweeper"
    # The producer's database, when the outbox is not in DATABASE_URL (inorder-admin audit).
    outbox_database_url: SecretStr | None = None
    # How often the active sweeper looks for overdue gaps.
    sweep_interval_s: float = Field(default=5.0, gt=0)
    # A sweeper that stops renewing loses the lease after this long; a standby takes over.
    lease_ttl_s: float = Field(default=15.0, gt=0)
    # How often the parked-events gauges are recomputed (cost grows with parked entities).
    gauge_interval_s: float = Field(default=15.0, gt=0)
    # Overdue entities handled per route and sweep; the rest wait for the next sweep.
    max_overdue_per_sweep: int = Field(default=1000, ge=1)
