"""The JSON Schema files shipped in ``schemas/json``: the language-neutral source of truth."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from schemas.errors import SchemaDefinitionError

_PAYLOAD_SUFFIX = ".schema.json"


def _json_dir() -> resources.abc.Traversable:
    return resources.files("schemas").joinpath("json")


@cache
def json_schema(name: str) -> dict[str, Any]:
    """The top-level schema file ``<name>.schema.json``, parsed once."""
    parsed: dict[str, Any] = orjson.loads(_json_dir().joinpath(f"{name}.schema.json").read_bytes())
    return parsed


def envelope_schema() -> dict[str, Any]:
    """The envelope schema."""
    return json_schema("envelope")


@cache
def payload_schemas() -> dict[str, dict[str, Any]]:
    """Every shipped payload schema by event type (the file name without its suffix)."""
    found: dict[str, dict[str, Any]] = {}
    for entry in _json_dir().joinpath("payloads").iterdir():
        if entry.name.endswith(_PAYLOAD_SUFFIX):
            found[entry.name.removesuffix(_PAYLOAD_SUFFIX)] = orjson.loads(entry.read_bytes())
    return found


def folder_schemas(folder: Path) -> dict[str, dict[str, Any]]:
    """Every ``<event_type>.schema.json`` in ``folder`` by event type; other files are ignored.

    A folder that cannot be read, or a schema file that is not a JSON object, is
    refused naming it (``SchemaDefinitionError``).
    """
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise SchemaDefinitionError(
            f"INORDER_PAYLOAD_SCHEMAS={folder}: cannot read the folder ({exc.strerror})"
        ) from None
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not entry.name.endswith(_PAYLOAD_SUFFIX) or not entry.is_file():
            continue
        try:
            parsed = orjson.loads(entry.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise SchemaDefinitionError(f"{entry}: not readable JSON ({exc})") from None
        if not isinstance(parsed, dict):
            raise SchemaDefinitionError(f"{entry}: a schema file holds a JSON object")
        found[entry.name.removesuffix(_PAYLOAD_SUFFIX)] = parsed
    return found


def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a schema pattern with ECMA-262 anchoring: ``$`` ends the string.

    Python's ``$`` also matches before a trailing newline; JSON Schema's does not.
    The shipped patterns use ``$`` only as an anchor.
    """
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))
