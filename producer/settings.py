"""Typed settings of the producer CLI, read from the environment only at start-up."""

from __future__ import annotations

from pydantic import Field

from schemas import DEFAULT_TOPICS
from schemas.runtime.config import InorderSettings, PostgresUrl


class ProducerSettings(InorderSettings):
    """Where the producer's database is, and which topic its events name."""

    # The producer's own database (the one holding the outbox table).
    database_url: PostgresUrl
    # Topic written into each outbox row.
    events_topic: str = Field(default=DEFAULT_TOPICS.events, min_length=1)
    log_level: str = "INFO"
