"""The JSON Schema files are the source of truth; the codec accepts exactly what they accept.

The reference is jsonschema-rs, an independent draft 2020-12 implementation.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas
from schemas.files import ecma_pattern, envelope_schema, payload_schemas
from schemas.limits import value_problem
from schemas.runtime.payloads import default_payload_schemas
from schemas.validation import validator_for

ENVELOPE = validator_for(envelope_schema())
FIELDS = sorted(envelope_schema()["properties"])

# Any JSON value within interoperable limits (64-bit integers, finite floats).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=300),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _strategy_for(spec: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values meeting one envelope property's schema (the keywords the envelope uses)."""
    if "$ref" in spec:
        spec = envelope_schema()["$defs"][spec["$ref"].removeprefix("#/$defs/")]
    if spec["type"] == "integer":
        return st.integers(spec.get("minimum"), spec.get("maximum"))
    if spec["type"] == "object":
        return st.dictionaries(st.text(max_size=5), json_values, max_size=4)
    if "pattern" in spec:
        high = spec.get("maxLength", 10**6)
        return st.from_regex(ecma_pattern(spec["pattern"]), fullmatch=True).filter(
            lambda s: len(s) <= high
        )
    return st.text(min_size=spec.get("minLength", 0), max_size=spec.get("maxLength"))


valid_documents = st.fixed_dictionaries(
    {name: _strategy_for(spec) for name, spec in envelope_schema()["properties"].items()},
    optional={"extra": json_values},
)


def _codec_accepts(doc: Any) -> bool:
    try:
        schemas.decode(json.dumps(doc).encode())
    except schemas.DecodeError:
        return False
    return True


def _storable(doc: Any) -> bool:
    """No store refuses it once read: an integer past 64 bits is read as the nearest double."""
    return value_problem(json.loads(json.dumps(doc), parse_int=_as_read)) is None


def _as_read(digits: str) -> int | float:
    number = int(digits)
    return number if value_problem(number) is None else float(number)


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    """A valid envelope with one field dropped, retyped or set to an edge value, or a non-object."""
    doc = dict(draw(valid_documents))
    field = draw(st.sampled_from(FIELDS))
    how = draw(st.sampled_from(["drop", "any", "edge", "whole"]))
    if how == "drop":
        del doc[field]
    elif how == "any":
        doc[field] = draw(json_values)
    elif how == "edge":
        doc[field] = draw(
            st.sampled_from([0, -1, 1, 2**63 - 1, 2**63, 1.0, 2.5, True, "", "a:b", "A", "x\n"])
        )
    else:
        return draw(json_values)
    return doc


def test_every_schema_file_is_a_valid_2020_12_schema() -> None:
    """The envelope and every payload schema pass the draft 2020-12 meta-schema."""
    for schema in [envelope_schema(), *payload_schemas().values()]:
        validator_for(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(valid_documents)
def test_codec_accepts_every_document_the_schema_generates(doc: dict[str, Any]) -> None:
    """Documents generated from the envelope schema are valid; the codec takes all it can store.

    JSON Schema cannot say what no store on the path holds (NUL, lone surrogates, nesting
    past ``MAX_DEPTH``): the codec refuses those too (``schemas.limits``).
    """
    assert ENVELOPE.is_valid(doc)
    assert _codec_accepts(doc) == _storable(doc)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents())
def test_codec_and_schema_agree_on_mutated_documents(doc: Any) -> None:
    """For mutated documents the codec accepts exactly those the schema accepts and stores hold."""
    assert _codec_accepts(doc) == (ENVELOPE.is_valid(doc) and _storable(doc))


@pytest.mark.parametrize("event_type", sorted(payload_schemas()))
def test_payload_schemas_are_registered_by_event_type(event_type: str) -> None:
    """Each shipped payload schema is known to the default registry under its event type."""
    assert event_type in default_payload_schemas()
    assert payload_schemas()[event_type]["$id"].endswith(event_type)
