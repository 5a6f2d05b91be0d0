"""Typed settings of the producer CLI, read from the environment only at start-up."""

from __future__ import annotations

from pydantic import Field

from schemas import DEFAULT_TOPICS
from schemas.runtime.config import LoggingSettings, PostgresUrl


class ProducerSettings(LoggingSettings):
    """Where the producer's database is, and which topic its events name."""

    database_url: PostgresUrl
    events_topic: str = Field(
        default=DEFAULT_TOPICS.events,
        min_length=1,
        description="Topic written into each outbox row",
    )
