"""The JSON Schema files shipped in ``schemas/json``: the language-neutral source of truth."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

import orjson

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


def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a schema pattern with ECMA-262 anchoring: ``$`` ends the string.

    Python's ``$`` also matches before a trailing newline; JSON Schema's does not.
    The shipped patterns use ``$`` only as an anchor.
    """
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))
