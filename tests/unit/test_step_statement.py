"""A step handler given as SQL: what its statement may name, and how the route reads it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from consumer.errors import RoutesError
from consumer.kinds.steps import statement
from consumer.kinds.steps.route import resolve
from consumer.routes import parse_routes
from schemas import Event

# Statement text with no percent sign (nor a digit or $, so a $n stays readable), and the
# pieces a statement may hold besides.
_PLAIN = st.text(st.characters(blacklist_characters="%$0123456789", codec="utf-8"), max_size=20)
_PARAMETER = st.sampled_from(statement.FIELDS).map(lambda name: f"%({name})s")


def _route(handler: str) -> str:
    return f'[[route]]\nstream = "s"\nkind = "step"\n[route.handlers."s.done"]\n{handler}\n'


def _event(seq: int) -> Event:
    return Event(f"e:1:{seq}", "s.done", "s", "e", 1, seq, "t0", "t1", {"amount": seq})


@given(st.lists(st.one_of(_PLAIN, _PARAMETER, st.just("%%")), min_size=1, max_size=12))
def test_fields_and_double_percent_signs_are_a_statement_s_only_percent_signs(
    pieces: list[str],
) -> None:
    """Any mix of text, the event's fields as parameters and %% reads clean (if not blank);
    the PREPARE numbers each field once, in first use, typed as the step sends it."""
    sql = "".join(pieces)
    assert statement.problem(sql) == (None if sql.strip() else "is empty")
    used = [p[2:-2] for p in pieces if p.startswith("%(")]
    order = list(dict.fromkeys(used))
    text = statement.prepared(sql, "x")
    assert sorted(set(map(int, re.findall(r"\$(\d+)", text)))) == list(range(1, len(order) + 1))
    if order:
        types = text[len("PREPARE x (") : text.index(") AS ")].split(", ")
        assert types == [
            {"payload": "jsonb", "generation": "bigint", "seq": "bigint"}.get(f, "unknown")
            for f in order
        ]
    assert text.count("$") == len(used)  # every parameter numbered, none left named


@given(
    _PLAIN,
    _PLAIN,
    st.one_of(
        st.sampled_from(["%s", "%d", "% ", "%(seq)d", "%(seq)", "%"]),
        st.from_regex(r"\A%\([a-z_]{1,12}\)s\Z").filter(lambda p: p[2:-2] not in statement.FIELDS),
    ),
)
def test_a_stray_percent_sign_or_an_unknown_field_is_refused(
    before: str, after: str, bad: str
) -> None:
    """A positional %s, another format, a lone % or a name that is not a field: one problem."""
    found = statement.problem(f"{before}{bad}{after}x")
    assert found is not None
    name = re.fullmatch(r"%\((\w+)\)s", bad)
    if name:
        assert f"%({name.group(1)})s" in found


def test_only_the_fields_a_statement_names_are_given_the_payload_as_jsonb() -> None:
    """The parameters are the named fields; the payload is sent as jsonb."""
    values = statement.fields(_event(3), frozenset({"seq", "payload"}))
    assert set(values) == {"seq", "payload"}
    assert values["seq"] == 3
    assert isinstance(values["payload"], Jsonb)
    assert set(statement.fields(_event(3))) == set(statement.FIELDS)


def test_a_sql_handler_runs_as_many_steps_at_once() -> None:
    """A handler given as sql has no function of its own: it runs a poll batch's steps of
    its type together, each in order, as a many function would."""
    [route] = parse_routes(_route("sql = '''UPDATE t SET n = %(seq)s WHERE id = %(entity_id)s'''"))
    handler = route.handlers["s.done"]  # type: ignore[attr-defined]
    assert (handler.function, handler.many, handler.external) == ("", False, False)
    [(entry, function)] = resolve(route).values()  # type: ignore[arg-type]
    assert entry.many is True
    assert entry.function == "sql of s.done"
    assert callable(function)


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        ("sql = 3", "sql of handler s.done must be a string"),
        ("sql = '  '", "sql of handler s.done is empty"),
        ("sql = 'SELECT %s'", "is neither a %(field)s parameter nor %%"),
        ("sql = 'SELECT %(amount)s'", "names %(amount)s, which is not one of"),
        ("sql = 'SELECT 1'\nfunction = 'm:f'", "function does not go with it"),
        ("sql = 'SELECT 1'\nexternal = true", "external does not go with it"),
        ("sql = 'SELECT 1'\nmany = true", "many does not go with it"),
        ("sql = 'SELECT 1'\nidempotent = true", "idempotent does not go with it"),
    ],
)
def test_a_sql_handler_that_cannot_run_is_refused_with_one_problem(handler: str, says: str) -> None:
    """A statement that is not text, is blank, has a stray % or names no field, or comes
    with a function or a flag: one problem naming the handler."""
    with pytest.raises(RoutesError) as refused:
        parse_routes(_route(handler))
    [problem] = refused.value.problems
    assert says in problem
