"""Where the payload schemas of the application's own event types come from, and the policy
for event types without one: the same two settings for emit, the relay and the batch kind."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from schemas.errors import SchemaDefinitionError
from schemas.runtime.config import InorderSettings, describe
from schemas.runtime.process import fail
from schemas.validation import PayloadSchemas


class PayloadSchemaSettings(InorderSettings):
    """The payload schema folder and the unknown-type policy; every writer and the relay."""

    payload_schemas: Path | None = Field(
        default=None,
        description="Folder of `<event_type>.schema.json` files (JSON Schema 2020-12): your "
        "own event types, beside the shipped ones",
    )
    unknown_event_types: Literal["refuse", "allow"] = Field(
        default="refuse",
        description="An event type with no schema: `refuse` (emit raises, the relay fails "
        "the row `unknown_type`) or `allow` (sent unchecked)",
    )

    @classmethod
    def from_environment(cls) -> PayloadSchemaSettings:
        """Read from the environment; a bad value raises ``SchemaDefinitionError`` naming it."""
        try:
            return cls()
        except ValidationError as exc:
            raise SchemaDefinitionError(describe(exc, cls)) from None


def registry_of(settings: PayloadSchemaSettings) -> PayloadSchemas:
    """The registry these settings describe (``SchemaDefinitionError`` naming a bad file)."""
    return PayloadSchemas.configured(
        settings.payload_schemas, allow_unknown=settings.unknown_event_types == "allow"
    )


def registry_or_exit(settings: PayloadSchemaSettings, program: str) -> PayloadSchemas:
    """The registry, or stop start-up with one line naming the folder or file to fix.

    Settings read from the environment (a program's) give the process-wide registry, read
    once: ``emit`` and the batch kind use the same one afterwards.
    """
    try:
        here = PayloadSchemaSettings.from_environment()
        mine = (settings.payload_schemas, settings.unknown_event_types)
        if mine == (here.payload_schemas, here.unknown_event_types):
            return default_payload_schemas()
        return registry_of(settings)
    except SchemaDefinitionError as exc:
        fail(program, [f"bad configuration: {exc}"])


@cache
def default_payload_schemas() -> PayloadSchemas:
    """The registry the settings name, built once: shipped schemas, the folder, the policy.

    Read from ``INORDER_PAYLOAD_SCHEMAS`` and ``INORDER_UNKNOWN_EVENT_TYPES`` on first
    use; a bad value raises ``SchemaDefinitionError`` naming the variable. The event
    contract (``schemas.validation``) reads no environment: this is where it is read.
    """
    return registry_of(PayloadSchemaSettings.from_environment())
