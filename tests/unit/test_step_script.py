"""A step's statements as one script: each prepared once, its values in ``$n`` order."""

from __future__ import annotations

import pytest

from consumer.kinds.steps.script import prepared, render


def _quote(value: object) -> str:
    """A stand-in quoter: text in angle brackets, numbers as they are."""
    return f"<{value}>" if isinstance(value, str) else str(value)


def test_named_values_are_numbered_in_first_use_order_and_reused() -> None:
    """A name used twice is one ``$n``; the EXECUTE passes each name once, in that order."""
    statement = prepared("UPDATE t SET a = %(b)s WHERE c = %(a)s AND d = %(b)s")
    assert statement.prepare.endswith("AS UPDATE t SET a = $1 WHERE c = $2 AND d = $1")
    assert statement.values({"a": 1, "b": 2}) == [2, 1]
    assert statement.count == 2


def test_positional_values_keep_their_order() -> None:
    """``%s`` placeholders become ``$1``, ``$2``... and the values go as given."""
    statement = prepared("INSERT INTO t VALUES (%s, %s, %s)")
    assert "VALUES ($1, $2, $3)" in statement.prepare
    assert statement.values(("x", 2, None)) == ["x", 2, None]


def test_mixed_placeholders_are_refused() -> None:
    """Named and positional values in one statement cannot be numbered one way."""
    with pytest.raises(ValueError, match="named or positional"):
        prepared("SELECT %s, %(a)s")


def test_a_statement_is_prepared_by_the_first_script_that_uses_it_only() -> None:
    """Unprepared: its PREPARE leads the script, once even when used twice; prepared: none."""
    claim = ("UPDATE t SET a = %s WHERE b = %s", (1, "e"))
    text, fresh = render(["BEGIN", claim, "COMMIT", "BEGIN", claim], set(), _quote)
    name = prepared(claim[0]).name
    assert fresh == [name]
    assert text == (
        f"PREPARE {name} AS UPDATE t SET a = $1 WHERE b = $2; BEGIN; "  # noqa: S608
        f"EXECUTE {name}(1, <e>); COMMIT; BEGIN; EXECUTE {name}(1, <e>)"
    )
    again, none = render([claim, "COMMIT"], {name}, _quote)
    assert none == []
    assert again == f"EXECUTE {name}(1, <e>); COMMIT"


def test_a_statement_without_values_is_executed_bare() -> None:
    """No values, no parentheses: ``EXECUTE name`` as the server takes it."""
    text, _ = render([("SELECT 1", ())], {prepared("SELECT 1").name}, _quote)
    assert text == f"EXECUTE {prepared('SELECT 1').name}"


def test_a_literal_percent_reaches_the_server_as_one() -> None:
    """psycopg's ``%%`` is a ``%`` in the PREPARE, even just before an ``s``."""
    statement = prepared("SELECT * FROM t WHERE a LIKE 'x%%s%%' AND b = %s")
    assert "LIKE 'x%s%' AND b = $1" in statement.prepare
    assert statement.count == 1


def test_different_statements_get_different_names() -> None:
    """The name is the statement's digest: two statements never share one."""
    assert prepared("SELECT %s").name != prepared("SELECT %s + 1").name
    assert prepared("SELECT %s").name == prepared("SELECT %s").name
