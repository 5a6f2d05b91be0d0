"""The application's own payload schemas: one folder and one unknown-type policy for all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas
from schemas.errors import SchemaDefinitionError, UnknownEventTypeError
from schemas.runtime.payloads import (
    PayloadSchemaSettings,
    default_payload_schemas,
    registry_of,
    registry_or_exit,
)
from schemas.validation import first_error, validator_for

ORDER = {"type": "object", "required": ["total"], "properties": {"total": {"type": "integer"}}}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A schema folder with one type of the application's own and a file that is no schema."""
    (tmp_path / "order.created.schema.json").write_bytes(orjson.dumps(ORDER))
    (tmp_path / "README.md").write_text("not a schema: ignored")
    return tmp_path


@pytest.fixture
def fresh_default() -> Iterator[None]:
    """The default registry rebuilt from the environment before and after the test."""
    default_payload_schemas.cache_clear()
    yield
    default_payload_schemas.cache_clear()


def test_a_folder_adds_its_types_beside_the_shipped_ones(folder: Path) -> None:
    """Types from the folder are checked; the shipped types are still there."""
    registry = _registry(folder)
    registry.validate("order.created", {"total": 3})
    with pytest.raises(schemas.PayloadError, match="total"):
        registry.validate("order.created", {"total": "3"})
    assert "subscription.created" in registry
    assert "README" not in registry


def _registry(folder: Path | None, *, allow: bool = False) -> schemas.PayloadSchemas:
    """The registry the two settings describe."""
    return registry_of(
        PayloadSchemaSettings(
            payload_schemas=folder, unknown_event_types="allow" if allow else "refuse"
        )
    )


def test_unknown_types_are_refused_by_default_naming_both_settings(folder: Path) -> None:
    """The default policy refuses a type with no schema and says how to add or allow it."""
    with pytest.raises(UnknownEventTypeError) as caught:
        _registry(folder).validate("order.shipped", {})
    assert "order.shipped.schema.json" in str(caught.value)
    assert "INORDER_PAYLOAD_SCHEMAS" in str(caught.value)
    assert "INORDER_UNKNOWN_EVENT_TYPES=allow" in str(caught.value)


def test_allowing_unknown_types_still_checks_the_known_ones(folder: Path) -> None:
    """Allowed unknown types pass unchecked; a type with a schema is still held to it."""
    registry = _registry(folder, allow=True)
    registry.validate("order.shipped", {"anything": [1]})
    with pytest.raises(schemas.PayloadError):
        registry.validate("order.created", {})


def test_a_folder_file_replaces_a_shipped_example_type(tmp_path: Path) -> None:
    """An application's own subscription.created schema wins over the shipped example's."""
    (tmp_path / "subscription.created.schema.json").write_bytes(orjson.dumps({"type": "object"}))
    _registry(tmp_path).validate("subscription.created", {"mine": True})


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("order.created.schema.json", b"{", "not readable JSON"),
        ("order.created.schema.json", b"[]", "holds a JSON object"),
        ("order.created.schema.json", b'{"type": 5}', "not a valid JSON Schema"),
        ("order.created.schema.json", b'{"pattern": "("}', "not a valid JSON Schema"),
        ("batch.accepted.schema.json", b"{}", "the batch kind's own"),
        ("bad type.schema.json", b"{}", "file name is not"),
        ("\u00e9.schema.json", b"{}", "file name is not"),
    ],
)
def test_a_bad_file_is_refused_naming_it(
    tmp_path: Path, name: str, content: bytes, said: str
) -> None:
    """A file that cannot be a payload schema stops the registry with its path and why."""
    (tmp_path / name).write_bytes(content)
    with pytest.raises(SchemaDefinitionError) as caught:
        _registry(tmp_path)
    assert str(tmp_path / name) in str(caught.value)
    assert said in str(caught.value)


def test_a_folder_that_cannot_be_read_names_the_setting(tmp_path: Path) -> None:
    """A missing folder is refused naming INORDER_PAYLOAD_SCHEMAS and the path."""
    with pytest.raises(SchemaDefinitionError, match=r"INORDER_PAYLOAD_SCHEMAS=.*missing"):
        _registry(tmp_path / "missing")


def test_the_default_registry_reads_the_environment(
    folder: Path, monkeypatch: pytest.MonkeyPatch, fresh_default: None
) -> None:
    """emit's default registry is the folder and policy the environment names."""
    monkeypatch.setenv("INORDER_PAYLOAD_SCHEMAS", str(folder))
    monkeypatch.setenv("INORDER_UNKNOWN_EVENT_TYPES", "allow")
    registry = default_payload_schemas()
    assert "order.created" in registry
    assert registry.allow_unknown


def test_a_bad_policy_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, fresh_default: None
) -> None:
    """A policy other than refuse or allow is refused naming INORDER_UNKNOWN_EVENT_TYPES."""
    monkeypatch.setenv("INORDER_UNKNOWN_EVENT_TYPES", "sometimes")
    with pytest.raises(SchemaDefinitionError, match="INORDER_UNKNOWN_EVENT_TYPES"):
        default_payload_schemas()


@pytest.mark.usefixtures("fresh_default")
def test_a_program_reads_its_schema_folder_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Start-up's check and the batch kind share one registry; other settings get their own."""
    monkeypatch.setenv("INORDER_PAYLOAD_SCHEMAS", str(tmp_path))
    checked = registry_or_exit(PayloadSchemaSettings(), "inorder-consumer")
    assert checked is default_payload_schemas()
    other = PayloadSchemaSettings(unknown_event_types="allow")
    assert registry_or_exit(other, "inorder-consumer") is not checked


_RULES = {
    "type": "object",
    "properties": {
        "plan": {"enum": ["pro", "basic"]},
        "seats": {"type": "integer", "minimum": 1},
        "note": {"type": "string", "maxLength": 3},
        "code": {"type": "string", "pattern": "^[A-Z]+$"},
    },
    "required": ["plan"],
    "additionalProperties": False,
}


@given(
    st.dictionaries(
        st.sampled_from(["plan", "seats", "note", "code", "other"]),
        st.one_of(
            st.text(min_size=1).map(lambda t: f"SECRET{t}"),
            st.integers(-10, 10),
            st.lists(st.just("SECRET")),
        ),
    )
)
def test_a_payload_that_breaks_its_schema_is_described_without_its_values(
    payload: dict[str, object],
) -> None:
    """The problem names the place and the rule broken, never a value of the payload."""
    problem = first_error(validator_for(_RULES), payload)
    if problem is not None:
        assert "SECRET" not in problem
        assert "breaks `" in problem
