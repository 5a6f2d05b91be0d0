"""Several streams feeding one projection table: each column has one owner, or start-up refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.errors import RoutesError
from consumer.routes import parse_routes


def _route(
    stream: str,
    columns: dict[str, str],
    *,
    table: str = "cust",
    key: str = "customer_id",
    gen: str | None = None,
    seq: str | None = None,
    entity_type_column: str | None = None,
) -> str:
    lines = [
        "[[route]]",
        f'stream = "{stream}"',
        'kind = "projection"',
        f'table = "{table}"',
        f'key = "{key}"',
        f'generation_column = "{gen or stream + "_gen"}"',
        f'seq_column = "{seq or stream + "_seq"}"',
    ]
    if entity_type_column:
        lines.append(f'entity_type_column = "{entity_type_column}"')
    lines.append("[route.columns]")
    lines += [f'{column} = "{field}"' for column, field in columns.items()]
    return "\n".join(lines) + "\n"


def _problems(text: str) -> list[str]:
    with pytest.raises(RoutesError) as refused:
        parse_routes(text)
    return refused.value.problems


def test_two_streams_with_their_own_columns_share_one_table() -> None:
    """Plan and bill streams, each with its own columns and versions, are one read model."""
    routes = parse_routes(
        _route("plan", {"plan": "plan", "seats": "seats"})
        + _route("bill", {"balance_cents": "balance", "due": "due"})
    )
    assert [r.stream for r in routes] == ["plan", "bill"]


def test_a_column_both_streams_write_is_refused_in_one_line() -> None:
    """Two routes writing `plan` into one row: one problem naming both routes and the column."""
    problems = _problems(
        _route("plan", {"plan": "plan"}) + _route("bill", {"plan": "plan", "due": "due"})
    )
    assert problems == [
        "routes plan and bill (table cust): both write plan; streams merged into one row must "
        "each own their columns and their own generation_column and seq_column (route a field "
        "two services change through one owner)"
    ]


def test_shared_version_columns_are_refused() -> None:
    """Two streams guarded by one (generation, seq) would each see the other's as its own."""
    [problem] = _problems(
        _route("plan", {"plan": "plan"}, gen="gen", seq="seq")
        + _route("bill", {"due": "due"}, gen="gen", seq="seq")
    )
    assert "both write gen, seq" in problem


def test_a_schema_qualified_name_is_the_same_table() -> None:
    """`cust` and `public.cust` are taken as one table: overlapping columns are refused."""
    [problem] = _problems(
        _route("plan", {"plan": "plan"}) + _route("bill", {"plan": "p"}, table="public.cust")
    )
    assert "both write plan" in problem


def test_tables_in_two_named_schemas_are_two_tables() -> None:
    """`a.cust` and `b.cust` are different tables: the same columns are fine."""
    parse_routes(
        _route("plan", {"plan": "plan"}, table="a.cust", gen="gen", seq="seq")
        + _route("bill", {"plan": "plan"}, table="b.cust", gen="gen", seq="seq")
    )


def test_different_keys_on_one_table_are_refused() -> None:
    """Two streams keyed by two columns would never meet in one row: refused, naming both."""
    [problem] = _problems(
        _route("plan", {"plan": "plan"}) + _route("bill", {"due": "due"}, key="account_id")
    )
    assert problem.startswith("routes plan and bill (table cust): streams writing one table")
    assert "customer_id/None and account_id/None" in problem


def test_rows_kept_apart_by_entity_type_may_share_columns() -> None:
    """With entity_type_column every stream has rows of its own, so columns may repeat."""
    common = {"gen": "generation", "seq": "seq", "entity_type_column": "kind"}
    parse_routes(
        _route("plan", {"name": "name"}, **common) + _route("bill", {"name": "name"}, **common)
    )


def test_entity_type_column_on_one_route_only_is_refused() -> None:
    """One stream keyed by (kind, key) and one by key alone cannot share a table safely."""
    [problem] = _problems(
        _route("plan", {"plan": "plan"}, entity_type_column="kind") + _route("bill", {"due": "due"})
    )
    assert "must name the same key and entity_type_column" in problem


@pytest.mark.parametrize(
    ("columns", "options", "says"),
    [
        ({"plan_seq": "x"}, {}, "maps 'plan_seq', which is the route's seq_column"),
        ({"customer_id": "id"}, {}, "maps 'customer_id', which is the route's key"),
        ({"p": "p"}, {"gen": "v", "seq": "v"}, "seq_column and generation_column are both 'v'"),
        ({"p": "p"}, {"key": "plan_gen"}, "generation_column and key are both 'plan_gen'"),
        ({"kind": "k"}, {"entity_type_column": "kind"}, "the route's entity_type_column"),
    ],
)
def test_a_column_with_two_roles_in_one_route_is_refused(
    columns: dict[str, str], options: dict[str, str], says: str
) -> None:
    """A column that is both a version (or the key) and a field is refused, naming both roles."""
    [problem] = _problems(_route("plan", columns, **options))
    assert says in problem


_COLUMN = st.sampled_from(["a", "b", "c", "d", "e", "f"])


@given(
    plan=st.sets(_COLUMN, min_size=1),
    bill=st.sets(_COLUMN, min_size=1),
    shared_versions=st.booleans(),
)
def test_refused_exactly_when_two_streams_write_one_column(
    plan: set[str], bill: set[str], shared_versions: bool
) -> None:
    """Over any two column sets: refused iff they overlap or the version columns are shared."""
    versions = {"gen": "g", "seq": "s"} if shared_versions else {}
    text = _route("plan", {c: c for c in sorted(plan)}, **versions) + _route(
        "bill", {c: c for c in sorted(bill)}, **versions
    )
    overlap = plan & bill
    if overlap or shared_versions:
        [problem] = _problems(text)
        named = problem.split("both write ")[1].split(";")[0].split(", ")
        assert set(named) == overlap | ({"g", "s"} if shared_versions else set())
    else:
        parse_routes(text)
