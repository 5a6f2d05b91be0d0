"""The routes file: a valid file gives typed routes; every mistake is named with its route."""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from consumer.deadletter import UNKNOWN_STREAM
from consumer.errors import RoutesError
from consumer.kinds.batches import BatchRoute
from consumer.kinds.projection import ProjectionApplier, ProjectionRoute
from consumer.kinds.steps import Handler, StepRoute
from consumer.loop.poll import Routing, prepare
from consumer.routes import parse_routes
from schemas import Event, encode
from schemas.runtime.reading import Reading

VALID = """
[[route]]
stream = "subscription"
kind = "projection"
table = "reporting.billing_view"
key = "subscription_id"
[route.columns]
plan = "plan"
city = "address.city"
"""

BATCH = """
[[route]]
stream = "report"
kind = "batch"
output_topic = "reports.assembled"
work_topic = "inorder.batch.work"
max_retries = 2
deadline_s = 600
on_incomplete = "hold"
"""

STEPS = """
[[route]]
stream = "ledger"
kind = "step"
[route.handlers]
"ledger.added" = "billing.steps:add"
[route.handlers."ledger.moved"]
function = "billing.steps:move_many"
many = true
"""


def test_step_route_keeps_each_handlers_flags() -> None:
    """A handler given as a string has no flags; a table may declare it takes many events."""
    [route] = parse_routes(STEPS)
    assert route == StepRoute(
        stream="ledger",
        handlers={
            "ledger.added": Handler("billing.steps:add"),
            "ledger.moved": Handler("billing.steps:move_many", many=True),
        },
    )


def test_batch_route_takes_its_results_stream_too() -> None:
    """A batch route keeps its settings and routes both its stream and `<stream>_result`."""
    [route] = parse_routes(BATCH)
    assert route == BatchRoute(
        stream="report",
        output_topic="reports.assembled",
        work_topic="inorder.batch.work",
        max_retries=2,
        deadline_s=600,
        on_incomplete="hold",
    )
    assert route.streams == ("report", "report_result")
    [default] = parse_routes('[[route]]\nstream = "batch"\nkind = "batch"\n')
    assert (default.max_retries, default.on_incomplete) == (0, "assemble_incomplete")


def test_projection_route_is_parsed_with_defaults() -> None:
    """A projection route keeps its table, key and column paths, with default version columns."""
    [route] = parse_routes(VALID)
    assert route == ProjectionRoute(
        stream="subscription",
        table="reporting.billing_view",
        key="subscription_id",
        columns={"plan": ("plan",), "city": ("address", "city")},
    )
    assert route.schema_and_table == ("reporting", "billing_view")
    assert (route.generation_column, route.seq_column) == ("generation", "seq")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not toml [", "not valid TOML"),
        ("", "no [[route]] tables"),
        (VALID + VALID, "route 2 (subscription): stream subscription already routed by route 1"),
        (VALID.replace('"projection"', '"mirror"'), "unknown kind 'mirror'"),
        (BATCH.replace("max_retries = 2", "max_retries = -1"), "max_retries must be a whole"),
        (BATCH.replace('"hold"', '"drop"'), "on_incomplete must be one of"),
        (BATCH.replace('"inorder.batch.work"', '"work topic"'), "work_topic must be a Kafka topic"),
        (BATCH.replace("deadline_s = 600", "deadline_s = 0"), "deadline_s must be a whole number"),
        (
            BATCH.replace('kind = "batch"', 'kind = "batch"\nworkers = 3'),
            "unknown setting 'workers'",
        ),
        (
            BATCH + VALID.replace('"subscription"', '"report_result"', 1),
            "stream report_result already routed by route 1",
        ),
        (
            VALID.replace('"subscription"\n', '"Sub:scription"\n', 1),
            "stream must be an entity_type",
        ),
        (VALID.replace('table = "reporting.billing_view"\n', ""), "needs 'table'"),
        (VALID.replace('key = "subscription_id"\n', ""), "needs 'key'"),
        (
            VALID.replace('"reporting.billing_view"', '"billing view"'),
            "table must be an SQL identifier",
        ),
        (VALID.replace('"reporting.billing_view"', '"a.b.c"'), "'schema.name'"),
        (VALID.replace('city = "address.city"', 'city = "address..city"'), "column city must name"),
        (
            VALID.replace('key = "subscription_id"', 'key = "id; drop table x"'),
            "key must be an SQL",
        ),
        (
            VALID.replace('kind = "projection"', 'kind = "projection"\nfilter = "x"'),
            "unknown setting 'filter'",
        ),
        ("x = 1\n" + VALID, "unknown top-level key 'x'"),
        (STEPS.replace("many = true", 'many = "yes"'), "many of handler ledger.moved must be"),
        (
            STEPS.replace("many = true", "many = true\nexternal = true"),
            "cannot be both many and external",
        ),
        (STEPS.replace('kind = "step"', 'kind = "step"\nbaseline = "yes"'), "baseline must be"),
        (
            STEPS.replace('kind = "step"', 'kind = "step"\nsnapshot_when_unrecoverable = true'),
            "snapshot_when_unrecoverable needs baseline = true",
        ),
    ],
)
def test_each_mistake_is_named(text: str, problem: str) -> None:
    """Each kind of mistake in the routes file raises RoutesError naming it."""
    with pytest.raises(RoutesError) as caught:
        parse_routes(text)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_all_problems_are_reported_together() -> None:
    """Several mistakes in one file are all listed, not only the first."""
    text = VALID.replace('"projection"', '"mirror"') + VALID.replace(
        'key = "subscription_id"\n', ""
    )
    with pytest.raises(RoutesError) as caught:
        parse_routes(text)
    assert len(caught.value.problems) == 2


def _message(entity_type: str, offset: int) -> Message:
    when = "2026-11-30T10:00:00Z"
    event = Event(f"e{offset}", f"{entity_type}.x", entity_type, "1", 1, offset, when, when, {})
    return Message(topic="events", partition=0, offset=offset, value=encode(event))


def test_a_poll_batch_is_shared_by_route_and_the_rest_named() -> None:
    """Events go to their stream's route; undecodable and unrouted messages become dead letters."""
    [route] = parse_routes(VALID)
    routing = Routing([ProjectionApplier(route)])  # type: ignore[arg-type]
    messages = [
        _message("subscription", 1),
        Message(topic="events", partition=0, offset=2, value=b"{"),
        _message("invoice", 3),
        _message("subscription", 4),
    ]
    prepared = prepare(messages, routing, Reading(1_000_000))
    [(applier, events)] = prepared.shares
    assert applier.route is route
    assert [e.seq for e in events] == [1, 4]
    assert [(d.message.offset(), d.reason) for d in prepared.dead] == [
        (2, "not_json"),
        (3, UNKNOWN_STREAM),
    ]


@pytest.mark.parametrize("value", ["0", "257", '"8"', "true", "1.5"])
def test_step_lanes_outside_1_to_256_are_refused_by_name(value: str) -> None:
    """lanes = 0, 257, a string, a boolean or a fraction: one problem naming lanes."""
    text = f'[[route]]\nstream = "s"\nkind = "step"\nlanes = {value}\n'
    with pytest.raises(RoutesError, match="lanes must be a whole number from 1 to 256"):
        parse_routes(text)


def test_step_lanes_unset_follow_the_consumer_setting() -> None:
    """A route without lanes leaves them to INORDER_STEP_LANES; one that sets them keeps its own."""
    text = '[[route]]\nstream = "a"\nkind = "step"\n'
    [unset, own] = parse_routes(text + text.replace('"a"', '"b"') + "lanes = 8\n")
    assert (unset.lanes, own.lanes) == (None, 8)  # type: ignore[union-attr]


def test_keep_lanes_open_is_a_flag_off_unless_set() -> None:
    """keep_lanes_open is false unless set true; anything but true or false is one problem."""
    text = '[[route]]\nstream = "a"\nkind = "step"\nlanes = 8\n'
    [unset, kept] = parse_routes(text + text.replace('"a"', '"b"') + "keep_lanes_open = true\n")
    assert (unset.keep_lanes_open, kept.keep_lanes_open) == (False, True)  # type: ignore[union-attr]
    for value in ('"yes"', "1", "0"):
        with pytest.raises(RoutesError, match="keep_lanes_open must be true or false") as refused:
            parse_routes(text + f"keep_lanes_open = {value}\n")
        assert len(refused.value.problems) == 1
