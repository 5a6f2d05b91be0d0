"""Typed settings of ``inorder-relay``, read from the environment only at start-up."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from schemas import DEFAULT_TOPICS, MAX_MESSAGE_BYTES
from schemas.runtime.config import KafkaClientSettings, PostgresUrl, RepairTimingSettings


class RelaySettings(KafkaClientSettings, RepairTimingSettings):
    """Everything the relay needs; every field has a default but the two addresses."""

    database_url: PostgresUrl
    # Rows read per slice and part (past the cursor, per remembered transaction) per batch.
    batch_size: int = Field(default=500, ge=1, le=10_000)
    # A relay holds its slices for this long without renewing; a standby takes over an
    # expired slice within this time of its relay stopping.
    lease_s: float = Field(default=10.0, ge=1, le=600)
    # Fallback poll when no NOTIFY arrives (missed notifications, other writers).
    poll_interval_s: float = Field(default=1.0, gt=0, le=600)
    # How long librdkafka may try to deliver one message before reporting failure.
    delivery_timeout_ms: int = Field(default=30_000, ge=1_000)
    # Sent rows created longer ago than this are deleted (7 days).
    retention_s: float = Field(default=7 * 86_400, gt=0)
    # How often retention runs, and how many rows one delete statement looks at.
    purge_interval_s: float = Field(default=60.0, gt=0)
    purge_batch_rows: int = Field(default=1_000, ge=1)
    # A repeat of the same republish range within this window re-sends nothing.
    republish_cooldown_s: float = Field(default=30.0, ge=0)
    republish_requests_topic: str = DEFAULT_TOPICS.republish_requests
    republish_results_topic: str = DEFAULT_TOPICS.republish_results
    relay_group_id: str = "inorder-relay"
    # Rows whose message would be larger are marked failed instead of sent.
    max_message_bytes: int = Field(default=MAX_MESSAGE_BYTES, ge=1024)
    # Create the republish topics at start-up when they are missing.
    create_topics: bool = True
    topic_partitions: int = Field(default=6, ge=1)
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=9400, ge=0, le=65535)
    log_level: str = "INFO"

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
