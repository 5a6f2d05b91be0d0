"""JSON Schema validation (draft 2020-12) for payloads, with ECMA-262 pattern anchoring."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from jsonschema.protocols import Validator

from schemas.errors import PayloadError, UnknownEventTypeError
from schemas.files import ecma_pattern, payload_schemas


def _pattern(
    validator: Validator, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


@cache
def _compiled(pattern: str) -> Any:
    return ecma_pattern(pattern)


ValidatorClass: Any = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _pattern}
)


def validator_for(schema: Mapping[str, Any]) -> Validator:
    """A draft 2020-12 validator for ``schema``; the schema itself is checked first."""
    ValidatorClass.check_schema(schema)
    validator: Validator = ValidatorClass(schema)
    return validator


class PayloadSchemas:
    """Payload schemas by event type: the shipped ones plus any the application adds."""

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        source = payload_schemas() if schemas is None else schemas
        self._validators = {name: validator_for(s) for name, s in source.items()}

    def add(self, event_type: str, schema: Mapping[str, Any]) -> None:
        """Register (or replace) the schema of one event type."""
        self._validators[event_type] = validator_for(schema)

    def add_directory(self, directory: Path) -> None:
        """Register every ``<event_type>.schema.json`` file in ``directory``."""
        for path in sorted(directory.glob("*.schema.json")):
            self.add(path.name.removesuffix(".schema.json"), orjson.loads(path.read_bytes()))

    def __contains__(self, event_type: object) -> bool:
        return event_type in self._validators

    def validate(self, event_type: str, payload: Any) -> None:
        """Raise ``PayloadError`` naming the first problem when ``payload`` does not match."""
        validator = self._validators.get(event_type)
        if validator is None:
            raise UnknownEventTypeError(event_type)
        error = jsonschema.exceptions.best_match(validator.iter_errors(payload))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(payload)"
            raise PayloadError(event_type, f"{where}: {error.message}")


@cache
def default_payload_schemas() -> PayloadSchemas:
    """The registry of the payload schemas shipped with inorder, built once."""
    return PayloadSchemas()
