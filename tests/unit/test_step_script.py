"""A step's statements as one script: each prepared once, its values in ``$n`` order."""

from __future__ import annotations

import pytest

from consumer.kinds.steps.script import prepared, render


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
    text, values, fresh = render(["BEGIN", claim, "COMMIT", "BEGIN", claim], set())
    name = prepared(claim[0]).name
    assert fresh == [name]
    assert text == (
        f"PREPARE {name} AS UPDATE t SET a = $1 WHERE b = $2; BEGIN; "  # noqa: S608
        f"EXECUTE {name}(%s, %s); COMMIT; BEGIN; EXECUTE {name}(%s, %s)"
    )
    assert values == [1, "e", 1, "e"]
    again, _, none = render([claim, "COMMIT"], {name})
    assert none == []
    assert again == f"EXECUTE {name}(%s, %s); COMMIT"


def test_a_literal_percent_stays_escaped_for_the_binding() -> None:
    """psycopg's ``%%`` is kept in the PREPARE: the script is bound like the statement was."""
    statement = prepared("SELECT * FROM t WHERE a LIKE 'x%%' AND b = %s")
    assert "LIKE 'x%%' AND b = $1" in statement.prepare


def test_different_statements_get_different_names() -> None:
    """The name is the statement's digest: two statements never share one."""
    assert prepared("SELECT %s").name != prepared("SELECT %s + 1").name
    assert prepared("SELECT %s").name == prepared("SELECT %s").name
