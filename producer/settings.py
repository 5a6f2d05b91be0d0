"""Typed settings of the producer CLI, read from the environment only at start-up."""

from __future__ import annotations

from pydantic import Field

from schemas import DEFAULT_TOPICS
from schemas.runtime.config import LoggingSettings
from schemas.runtime.payloads import PayloadSchemaSettings
from schemas.runtime.urls import PostgresUrl


class ProducerSettings(PayloadSchemaSettings, LoggingSettings):
    """Where the producer's database is, which topic its events name, and their schemas.

    ``emit`` in an application reads the two payload schema settings the same way.
    """

    database_url: PostgresUrl
    events_topic: str = Field(
        default=DEFAULT_TOPICS.events,
        min_length=1,
        description="Topic written into each outbox row",
    )
    work_topic: str = Field(
        default=DEFAULT_TOPICS.batch_work,
        min_length=1,
        description="Topic of the work items `batches` writes (the workers read it)",
    )
