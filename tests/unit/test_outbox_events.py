"""The checks and error translation every outbox writer shares."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from schemas.outbox.events import COLUMNS, OutboxEvent, duplicate_of, records


class _WrappedError(Exception):
    """An error a library raises around the driver's (SQLAlchemy keeps it as ``orig``)."""

    def __init__(self, orig: BaseException) -> None:
        super().__init__("wrapped")
        self.orig = orig


def _driver_error(**attributes: Any) -> Exception:
    error = Exception("duplicate key value violates unique constraint")
    for name, value in attributes.items():
        setattr(error, name, value)
    return error


PSYCOPG = _driver_error(
    sqlstate="23505",
    diag=SimpleNamespace(constraint_name="outbox_event_id_key", message_detail="Key (e)=(x)."),
)
PSYCOPG2 = _driver_error(
    pgcode="23505", diag=SimpleNamespace(constraint_name="outbox_event_id_key", message_detail="")
)
ASYNCPG = _driver_error(sqlstate="23505", constraint_name="outbox_event_id_key", detail="Key (e)")


def _django(cause: BaseException) -> Exception:
    error = Exception("IntegrityError")
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    "raised",
    [PSYCOPG, PSYCOPG2, ASYNCPG, _WrappedError(PSYCOPG), _WrappedError(ASYNCPG), _django(PSYCOPG)],
    ids=["psycopg", "psycopg2", "asyncpg", "sqlalchemy", "sqlalchemy-asyncpg", "django"],
)
def test_a_unique_violation_through_any_driver_is_a_duplicate(raised: BaseException) -> None:
    """The driver's unique violation, however wrapped, becomes DuplicateEventError with its name."""
    found = duplicate_of(raised)
    assert found is not None
    assert found.constraint == "outbox_event_id_key"


@pytest.mark.parametrize(
    "raised",
    [_driver_error(sqlstate="23503"), _WrappedError(_driver_error(pgcode="40001")), Exception("x")],
)
def test_other_errors_are_not_duplicates(raised: BaseException) -> None:
    """A foreign-key violation, a serialization failure or a plain error is left as it is."""
    assert duplicate_of(raised) is None


def test_records_carry_every_column_in_the_order_given() -> None:
    """A batch goes as one JSON array of rows, in order; payload and headers nested; ids default."""
    batch = [
        OutboxEvent("order", "o-1", 3, "order.created", {"t": 1}, headers={"h": "v"}),
        OutboxEvent("order", "o-0", 1, "order.created", {}, event_id="mine"),
    ]
    rows = orjson.loads(records(batch))
    assert [r["entity_id"] for r in rows] == ["o-1", "o-0"]
    assert rows[0]["payload"] == {"t": 1}
    assert rows[0]["headers"] == {"h": "v"}
    assert [r["event_id"] for r in rows] == ["order:o-1:1:3", "mine"]
    assert set(rows[1]) == set(COLUMNS)
