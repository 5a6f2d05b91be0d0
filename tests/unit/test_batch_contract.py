"""The batch contract's names live once in ``schemas.batches``: the JSON Schema and tables agree."""

from __future__ import annotations

import re

import orjson

from schemas.batches import ACCEPTED, Action, BatchStatus, ItemState, OnIncomplete
from tests.support.services import ROOT

PAYLOADS = ROOT / "schemas" / "json" / "payloads"
MIGRATIONS = sorted((ROOT / "consumer" / "migrations").glob("*.sql"))


def _checks(column: str) -> list[set[str]]:
    """The value lists of every CHECK (column IN (...)) the migrations create, in order."""
    return [
        set(re.findall(r"'([a-z_]+)'", listed))
        for path in MIGRATIONS
        for listed in re.findall(rf"{column}\s+IN\s*\(([^)]*)\)", path.read_text(), flags=re.S)
    ]


def _check_values(column: str) -> set[str]:
    """The values the newest CHECK (column IN (...)) allows."""
    return _checks(column)[-1]


def test_on_incomplete_is_the_schema_s_enum() -> None:
    """batch.accepted's JSON Schema allows exactly the OnIncomplete values."""
    schema = orjson.loads((PAYLOADS / f"{ACCEPTED}.schema.json").read_bytes())
    assert schema["properties"]["on_incomplete"]["enum"] == [v.value for v in OnIncomplete]


def test_every_state_enum_is_its_table_s_check() -> None:
    """The CHECK constraints the migrations create allow exactly each enum's values."""
    assert _check_values("on_incomplete") == set(OnIncomplete)
    assert _check_values("action") == set(Action)
    assert _check_values("state") == set(ItemState)
    statuses = {frozenset(v) for v in _checks("status")}
    assert frozenset(BatchStatus) in statuses
