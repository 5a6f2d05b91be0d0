"""Typed settings of the producer CLI, read from the environment only at start-up."""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import DEFAULT_TOPICS


class ProducerSettings(BaseSettings):
    """Where the producer's database is, and which topic its events name."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore")

    # The producer's own database (the one holding the outbox table).
    database_url: SecretStr = Field(
        validation_alias=AliasChoices("DATABASE_URL", "INORDER_DATABASE_URL")
    )
    # Topic written into each outbox row.
    events_topic: str = Field(
        default=DEFAULT_TOPICS.events, validation_alias="INORDER_EVENTS_TOPIC", min_length=1
    )
    log_level: str = Field(default="INFO", validation_alias="INORDER_LOG_LEVEL")

    @field_validator("database_url")
    @classmethod
    def _is_postgres_url(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL, e.g. postgresql://user@host:5432/db")
        return value
