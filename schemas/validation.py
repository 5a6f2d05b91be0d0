"""JSON Schema validation (draft 2020-12) of payloads and protocol messages, via jsonschema-rs.

jsonschema-rs compiles a schema once and validates in well under a microsecond,
and its regexes follow ECMA-262 as JSON Schema requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema_rs

from schemas.codec import field_problem
from schemas.errors import PayloadError, SchemaDefinitionError, UnknownEventTypeError
from schemas.files import folder_schemas, payload_schemas
from schemas.limits import safe_text

# The batch kind's own messages: their schemas are its protocol, never replaced.
_PROTOCOL_PREFIX = "batch."

Validator = jsonschema_rs.Draft202012Validator


def validator_for(schema: Mapping[str, Any]) -> Validator:
    """A compiled draft 2020-12 validator; a schema that is not valid itself is refused."""
    try:
        jsonschema_rs.meta.validate(dict(schema))
        # Compiling checks what the meta-schema cannot (a pattern that is no regex).
        return jsonschema_rs.Draft202012Validator(dict(schema))
    except jsonschema_rs.ValidationError as exc:
        raise SchemaDefinitionError(f"not a valid JSON Schema: {exc.message}") from exc


def first_error(validator: Validator, instance: Any) -> str | None:
    """Where and how ``instance`` first breaks the schema, or None when it is valid.

    Said from the schema's side only: the place in the document (names cut to 40
    characters) and the rule it breaks, never a value of the document. The validator's
    own message quotes the value (a whole payload, for a type error at its root), and
    these lines go to logs, to failed outbox rows and to dead letters.
    """
    if validator.is_valid(instance):
        return None
    error = next(iter(validator.iter_errors(instance)))
    where = "/".join(safe_text(str(p)[:40]) for p in error.instance_path) or "(document)"
    rule = [str(p) for p in error.schema_path]
    keyword = rule[-1] if rule else "schema"
    missing = getattr(error.kind, "property", None) if keyword == "required" else None
    named = f": {safe_text(str(missing)[:40])!r} is missing" if missing is not None else ""
    return f"{where}: breaks `{keyword}` (schema /{'/'.join(rule)}){named}"


class PayloadSchemas:
    """Payload schemas by event type: the shipped ones plus any the application adds.

    ``allow_unknown`` is the one policy for event types without a schema: False
    refuses them (``validate`` raises ``UnknownEventTypeError``), True lets them pass
    unchecked. emit, the relay and the batch kind all ask this registry.
    """

    def __init__(
        self,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        allow_unknown: bool = False,
    ) -> None:
        source = payload_schemas() if schemas is None else schemas
        self._validators = {name: validator_for(s) for name, s in source.items()}
        self.allow_unknown = allow_unknown

    @classmethod
    def configured(cls, folder: Path | None, *, allow_unknown: bool) -> PayloadSchemas:
        """The shipped schemas, those in ``folder`` beside them, and the unknown-type policy.

        A folder's file may replace a shipped example type, never the batch kind's own
        (``batch.*``); a file that is not a valid schema, or whose name is not a valid
        event type, is refused naming it.
        """
        registry = cls(allow_unknown=allow_unknown)
        if folder is None:
            return registry
        for event_type, schema in folder_schemas(folder).items():
            where = folder / f"{event_type}.schema.json"
            problem = field_problem("event_type", event_type)
            if problem is not None:
                raise SchemaDefinitionError(f"{where}: the file name is not an {problem[1]}")
            if event_type.startswith(_PROTOCOL_PREFIX):
                raise SchemaDefinitionError(
                    f"{where}: {_PROTOCOL_PREFIX}* types are the batch kind's own; rename it"
                )
            try:
                registry.add(event_type, schema)
            except SchemaDefinitionError as exc:
                raise SchemaDefinitionError(f"{where}: {exc}") from None
        return registry

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
            if self.allow_unknown:
                return
            raise UnknownEventTypeError(event_type)
        problem = first_error(validator, payload)
        if problem is not None:
            raise PayloadError(event_type, problem)
