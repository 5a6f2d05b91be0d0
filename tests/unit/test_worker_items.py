"""The example worker reads a work item, or refuses the message with a line, never raising."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from producer.worker import work_item
from schemas import encode
from tests.faults.mutations import valid_event
from tests.support.messages import StandIn


def _work(payload: Any) -> bytes:
    doc = orjson.loads(encode(valid_event(1)))
    doc.update(entity_type="batch", event_type="batch.work_item", payload=payload)
    return orjson.dumps(doc)


GOOD = {"batch_id": "b1", "position": 2, "item_key": "B", "input": {"x": 1}}


def test_a_work_item_is_read() -> None:
    """A valid work item becomes the item the worker finishes."""
    item = work_item(StandIn(_work(GOOD)))  # type: ignore[arg-type]
    assert item is not None
    assert (item.batch_id, item.position, item.item_key) == ("b1", 2, "B")


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"batch_id": "b1", "item_key": "B"},
        {**GOOD, "position": "2"},
        {**GOOD, "position": 2**31},
        {**GOOD, "item_key": ""},
        {**GOOD, "input": [1]},
        {**GOOD, "extra": True},
    ],
)
def test_a_work_item_breaking_its_schema_is_refused_not_raised(payload: Any) -> None:
    """Missing keys, wrong types or numbers past their column: None and a log line."""
    assert work_item(StandIn(_work(payload))) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value", [None, b"", b"{", b"[]", _work(GOOD).replace(b'"b1"', b'"\\u0000"')]
)
def test_a_message_that_is_no_event_is_refused(value: bytes | None) -> None:
    """Not an event at all: None."""
    assert work_item(StandIn(value)) is None  # type: ignore[arg-type]
