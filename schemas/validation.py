"""JSON Schema validation (draft 2020-12) of payloads and protocol messages, via jsonschema-rs.

jsonschema-rs compiles a schema once and validates in well under a microsecond,
and its regexes follow ECMA-262 as JSON Schema requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any

import jsonschema_rs

from schemas.errors import PayloadError, SchemaDefinitionError, UnknownEventTypeError
from schemas.files import payload_schemas

Validator = jsonschema_rs.Draft202012Validator


def validator_for(schema: Mapping[str, Any]) -> Validator:
    """A compiled draft 2020-12 validator; a schema that is not valid itself is refused."""
    try:
        jsonschema_rs.meta.validate(dict(schema))
    except jsonschema_rs.ValidationError as exc:
        raise SchemaDefinitionError(f"not a valid JSON Schema: {exc.message}") from exc
    return jsonschema_rs.Draft202012Validator(dict(schema))


def first_error(validator: Validator, instance: Any) -> str | None:
    """Where and how ``instance`` first breaks the schema, or None when it is valid."""
    if validator.is_valid(instance):
        return None
    error = next(iter(validator.iter_errors(instance)))
    where = "/".join(str(p) for p in error.instance_path) or "(document)"
    return f"{where}: {error.message}"


class PayloadSchemas:
    """Payload schemas by event type: the shipped ones plus any the application adds."""

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        source = payload_schemas() if schemas is None else schemas
        self._validators = {name: validator_for(s) for name, s in source.items()}

    def add(self, event_type: str, schema: Mapping[str, Any]) -> None:
        """Register (or replace) the schema of one event type."""
        self._validators[event_type] = validator_for(schema)

    def __contains__(self, event_type: object) -> bool:
        return event_type in self._validators

    def validators(self) -> Mapping[str, Validator]:
        """The compiled validators by event type, read-only (for checking many at once)."""
        return MappingProxyType(self._validators)

    def validate(self, event_type: str, payload: Any) -> None:
        """Raise ``PayloadError`` naming the first problem when ``payload`` does not match."""
        validator = self._validators.get(event_type)
        if validator is None:
            raise UnknownEventTypeError(event_type)
        problem = first_error(validator, payload)
        if problem is not None:
            raise PayloadError(event_type, problem)


@cache
def default_payload_schemas() -> PayloadSchemas:
    """The registry of the payload schemas shipped with inorder, built once."""
    return PayloadSchemas()
