"""A step's statements as one script: each prepared once, its values in ``$n`` order."""

from __future__ import annotations

import pytest
from psycopg import errors

from consumer.kinds.steps.errors import StatementsLostError
from consumer.kinds.steps.script import Answers, Next, Part, after, prepared, render


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


LOST_ERROR = errors.InvalidSqlStatementName("prepared statement does not exist")
# A closing carrying the next opening: the log, its commit, then the next step's statements.
CLOSING: list[Part] = [("log", ()), "COMMIT", "BEGIN", ("attempt", ()), "COMMIT"]


@pytest.mark.parametrize(
    ("answered", "idle", "last", "expected"),
    [
        (0, True, False, Next.FROM_IDLE),  # lost from idle: rolled back, sent again
        (0, True, True, Next.DONE),  # lost again: the answers say so
        (0, False, False, Next.FROM_SAVEPOINT),  # the log lost: back to the savepoint
        (3, False, False, Next.DONE),  # the next attempt lost: the step committed before it
        (2, False, True, Next.DONE),
    ],
)
def test_a_script_whose_statements_were_lost_is_sent_again_only_where_nothing_committed(
    answered: int, idle: bool, last: bool, expected: Next
) -> None:
    """From idle, again from the start; inside a transaction, again from the savepoint only
    while the script's first COMMIT has not run."""
    done = Answers([None] * answered, LOST_ERROR)
    assert after(done, CLOSING, idle=idle, last=last) is expected


def test_statements_lost_twice_inside_a_transaction_raise_an_outage() -> None:
    """Lost again after going back to the savepoint: the step's transaction cannot go on."""
    with pytest.raises(StatementsLostError):
        after(Answers([], LOST_ERROR), CLOSING, idle=False, last=True)


@pytest.mark.parametrize("idle", [True, False])
def test_answers_without_a_lost_statement_are_done(idle: bool) -> None:
    """An answered script, or one failing for another reason, is not sent again."""
    assert after(Answers([None]), CLOSING, idle=idle, last=False) is Next.DONE
    other = Answers([], errors.UniqueViolation("duplicate"))
    assert after(other, CLOSING, idle=idle, last=False) is Next.DONE
