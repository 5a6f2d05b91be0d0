"""Typed settings of the producer CLI, read from the environment only at start-up."""

from __future__ import annotations

from pydantic import Field

from schemas import DEFAULT_TOPICS
from schemas.runtime.config import InorderSettings, PostgresUrl


class ProducerSettings(InorderSettings):
    """Where the producer's database is, and which topic its events name."""

    database_url: PostgresUrl
    events_topic: str = Field(
        default=DEFAULT_TOPICS.events,
        min_length=1,
        description="Topic written into each outbox row",
    )
    log_level: str = Field(default="INFO", description="structlog level (JSON lines on stderr)")
