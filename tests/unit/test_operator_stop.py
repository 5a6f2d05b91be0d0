"""What only the operator can fix stops a program in one line, at start-up as later; an
outage or anything else is left to the caller."""

from __future__ import annotations

import psycopg
import pytest

from schemas.runtime.process import stop_for_operator


def test_a_missing_grant_stops_with_one_line_and_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    """permission denied (42501) names the table in one stderr line; the exit code is 3."""
    exc = psycopg.errors.InsufficientPrivilege("permission denied for table outbox_relay_slices")
    with pytest.raises(SystemExit) as stopped:
        stop_for_operator("inorder-consumer", exc)
    assert stopped.value.code == 3
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("inorder-consumer: stopped: permission denied for table")
    assert "grants" in line


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection refused"),
        psycopg.errors.SerializationFailure("could not serialize"),
        ValueError("a bug"),
    ],
)
def test_anything_else_is_left_to_the_caller(exc: Exception) -> None:
    """An outage or a bug returns: the caller waits it out or lets it show."""
    assert stop_for_operator("inorder-consumer", exc) is None
