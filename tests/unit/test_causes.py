"""Errors classified by cause: every SQLSTATE, every Kafka error code, the Redis replies."""

from __future__ import annotations

import inspect

import orjson
import psycopg
import pytest
import redis
from confluent_kafka import KafkaError, KafkaException
from psycopg import errors as pg

from consumer.errors import DependencyDownError, TableChangedError
from outbox_relay.errors import SchemaNotReadyError
from outbox_relay.republisher import RepublishDeliveryError
from schemas.runtime import causes
from schemas.runtime.causes import Cause, cause, kafka_cause, postgres_cause, redis_cause
from schemas.runtime.outages import dependency, down, reason, waited_out

# Every SQLSTATE psycopg knows, with its error class.
SQLSTATES = {
    cls.sqlstate: cls
    for cls in vars(pg).values()
    if inspect.isclass(cls) and issubclass(cls, psycopg.Error) and getattr(cls, "sqlstate", None)
}
KAFKA_CODES = {name: code for name, code in vars(KafkaError).items() if type(code) is int}

EXPECTED_CODES = {
    "08006": Cause.OUTAGE,  # connection failure
    "08001": Cause.OUTAGE,  # cannot connect
    "53100": Cause.OUTAGE,  # disk full
    "53200": Cause.OUTAGE,  # out of memory
    "53300": Cause.OUTAGE,  # too many connections
    "57P01": Cause.OUTAGE,  # admin shutdown
    "57P02": Cause.OUTAGE,  # crash shutdown
    "57P03": Cause.OUTAGE,  # cannot connect now
    "40001": Cause.OUTAGE,  # serialization failure
    "40P01": Cause.OUTAGE,  # deadlock detected
    "55P03": Cause.OUTAGE,  # lock not available
    "22P05": Cause.INPUT,  # untranslatable character: a NUL in text
    "22003": Cause.INPUT,  # numeric value out of range
    "22001": Cause.INPUT,  # string too long
    "22P02": Cause.INPUT,  # invalid text representation
    "23505": Cause.INPUT,  # unique violation
    "23514": Cause.INPUT,  # check violation
    "42601": Cause.INPUT,  # syntax error
    "42P01": Cause.OPERATOR,  # undefined table: dropped under a route
    "42703": Cause.OPERATOR,  # undefined column
    "42P10": Cause.OPERATOR,  # ON CONFLICT's unique index dropped under a route
    "42804": Cause.OPERATOR,  # datatype mismatch: a column's type changed
    "42883": Cause.OPERATOR,  # no operator for the changed types
    "54000": Cause.INPUT,  # program limit exceeded
    "54001": Cause.INPUT,  # statement too complex
    "57014": Cause.INPUT,  # query canceled: a statement timeout spent on one input
    "25P02": Cause.INPUT,  # in failed transaction
    "P0001": Cause.INPUT,  # raise exception (a trigger refusing the row)
    "42501": Cause.OPERATOR,  # insufficient privilege
    "28P01": Cause.OPERATOR,  # invalid password
    "3D000": Cause.OPERATOR,  # invalid catalog name
    "3F000": Cause.OPERATOR,  # invalid schema name
}


def test_every_sqlstate_class_psycopg_knows_is_in_the_table() -> None:
    """No SQLSTATE class falls through to the default: each is classified on purpose."""
    classes = {code[:2] for code in SQLSTATES}
    assert classes <= set(causes._PG_CLASSES), classes - set(causes._PG_CLASSES)


@pytest.mark.parametrize("sqlstate", sorted(SQLSTATES))
def test_every_sqlstate_has_one_cause(sqlstate: str) -> None:
    """Each of psycopg's SQLSTATEs: its code's own entry, else its class's."""
    expected = causes._PG_CODES.get(sqlstate) or causes._PG_CLASSES[sqlstate[:2]]
    assert postgres_cause(sqlstate) is expected
    assert cause(SQLSTATES[sqlstate]("x")) is expected


@pytest.mark.parametrize(("sqlstate", "expected"), sorted(EXPECTED_CODES.items()))
def test_the_codes_that_matter_most_are_classified_as_documented(
    sqlstate: str, expected: Cause
) -> None:
    """Outages wait, bad input is refused, missing grants stop the process (README table)."""
    assert postgres_cause(sqlstate) is expected


def test_an_error_with_no_sqlstate_is_an_outage_or_a_refused_value() -> None:
    """A lost connection has no code and is waited out; a value psycopg cannot adapt is input."""
    assert postgres_cause(None) is Cause.OUTAGE
    assert cause(psycopg.OperationalError("server closed the connection")) is Cause.OUTAGE
    assert cause(psycopg.InterfaceError("connection already closed")) is Cause.OUTAGE
    assert cause(psycopg.DataError("cannot adapt")) is Cause.INPUT
    assert cause(psycopg.ProgrammingError("cannot adapt type")) is Cause.INPUT


def test_an_unknown_sqlstate_class_is_the_inputs() -> None:
    """A class added by a later PostgreSQL is refused with its input, never waited on forever."""
    assert postgres_cause("ZZ000") is Cause.INPUT


@pytest.mark.parametrize("name", sorted(KAFKA_CODES))
def test_every_kafka_error_code_has_one_cause(name: str) -> None:
    """Every code librdkafka defines: in the input or operator set, else an outage."""
    code = KAFKA_CODES[name]
    expected = (
        Cause.INPUT
        if code in causes._KAFKA_INPUT
        else Cause.OPERATOR
        if code in causes._KAFKA_OPERATOR
        else Cause.OUTAGE
    )
    assert kafka_cause(code) is expected
    assert cause(KafkaException(KafkaError(code))) is expected


def test_the_input_and_operator_kafka_sets_do_not_overlap() -> None:
    """A Kafka code means one thing."""
    assert not causes._KAFKA_INPUT & causes._KAFKA_OPERATOR


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, Cause.INPUT),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, Cause.INPUT),
        (KafkaError._UNKNOWN_TOPIC, Cause.INPUT),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, Cause.INPUT),
        (KafkaError._INVALID_ARG, Cause.INPUT),
        (KafkaError.INVALID_RECORD, Cause.INPUT),
        (KafkaError._TRANSPORT, Cause.OUTAGE),
        (KafkaError._ALL_BROKERS_DOWN, Cause.OUTAGE),
        (KafkaError._MSG_TIMED_OUT, Cause.OUTAGE),
        (KafkaError.NOT_ENOUGH_REPLICAS, Cause.OUTAGE),
        (KafkaError.LEADER_NOT_AVAILABLE, Cause.OUTAGE),
        (KafkaError.NOT_LEADER_FOR_PARTITION, Cause.OUTAGE),
        (KafkaError._QUEUE_FULL, Cause.OUTAGE),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, Cause.OPERATOR),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, Cause.OPERATOR),
        (KafkaError.SASL_AUTHENTICATION_FAILED, Cause.OPERATOR),
    ],
)
def test_the_kafka_codes_that_matter_most_are_classified_as_documented(
    code: int, expected: Cause
) -> None:
    """A row Kafka will never take fails that row; brokers away are waited out."""
    assert kafka_cause(code) is expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (redis.ConnectionError("refused"), Cause.OUTAGE),
        (redis.TimeoutError("timed out"), Cause.OUTAGE),
        (redis.exceptions.ClusterDownError("CLUSTERDOWN"), Cause.OUTAGE),
        (redis.exceptions.TryAgainError("TRYAGAIN"), Cause.OUTAGE),
        (redis.exceptions.ReadOnlyError("READONLY replica"), Cause.OUTAGE),
        (redis.ResponseError("MISCONF Errors writing to the AOF file"), Cause.OUTAGE),
        (redis.ResponseError("OOM command not allowed"), Cause.OUTAGE),
        (redis.exceptions.BusyLoadingError("LOADING dataset"), Cause.OUTAGE),
        (redis.ResponseError("WRONGTYPE Operation against a key"), Cause.INPUT),
        (redis.ResponseError("ERR value is not an integer"), Cause.INPUT),
        (redis.exceptions.DataError("Invalid input of type"), Cause.INPUT),
        (redis.exceptions.NoPermissionError("NOPERM no permissions"), Cause.OPERATOR),
        (redis.AuthenticationError("WRONGPASS"), Cause.OPERATOR),
    ],
)
def test_redis_errors_by_class_and_reply(exc: redis.RedisError, expected: Cause) -> None:
    """A full disk or a failover is waited out; a bad value refused; a missing grant stops."""
    assert redis_cause(exc) is expected
    assert cause(exc) is expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (DependencyDownError("dead letters not delivered"), Cause.OUTAGE),
        (SchemaNotReadyError("outbox missing"), Cause.OUTAGE),
        (RepublishDeliveryError("answer not delivered"), Cause.OUTAGE),
        (ConnectionResetError("reset"), Cause.OUTAGE),
        (MemoryError(), Cause.OUTAGE),
        (TypeError("Recursion limit reached"), Cause.INPUT),
        (orjson.JSONEncodeError("Integer exceeds 64-bit range"), Cause.INPUT),
        (RecursionError("maximum recursion depth exceeded"), Cause.INPUT),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), Cause.INPUT),
        (ValueError("bad"), Cause.INPUT),
        (KeyError("missing"), Cause.INPUT),
        (TableChangedError("route billing: table billing_view changed"), Cause.OPERATOR),
    ],
)
def test_other_errors_are_the_inputs_unless_they_name_an_outage(
    exc: BaseException, expected: Cause
) -> None:
    """Anything one input raises is that input's, unless the error itself says a service is down."""
    assert cause(exc) is expected


@pytest.mark.parametrize(
    ("exc", "waited"),
    [
        (psycopg.OperationalError("server closed the connection"), True),
        (pg.AdminShutdown("terminating connection"), True),
        (pg.QueryCanceled("canceling statement due to statement timeout"), True),
        (DependencyDownError("dead letters not delivered"), True),
        (redis.ResponseError("MISCONF Errors writing to the AOF file"), True),
        (KafkaException(KafkaError(KafkaError._TRANSPORT)), True),
        (KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)), True),
        (pg.InsufficientPrivilege("permission denied"), False),
        (pg.UndefinedTable('relation "billing_view" does not exist'), False),
        (KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)), False),
        (TypeError("a bug"), False),
    ],
)
def test_loops_wait_out_outages_and_stray_service_errors_not_the_operators(
    exc: BaseException, waited: bool
) -> None:
    """Outside every input's barrier: outages and service errors wait; the operator's stop."""
    assert waited_out(exc) is waited


@pytest.mark.parametrize(
    ("exc", "is_down"),
    [
        (psycopg.OperationalError("server closed the connection"), True),
        (redis.ConnectionError("Connection refused"), True),
        (redis.ResponseError("MISCONF Errors writing to the AOF file: No space left"), True),
        (redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'"), True),
        (redis.ResponseError("LOADING Redis is loading the dataset in memory"), True),
        (pg.DiskFull("could not extend file: No space left on device"), True),
        (KafkaException(KafkaError(KafkaError._TRANSPORT)), True),
        (redis.ResponseError("NOPERM this user has no permissions to run 'ping'"), False),
        (redis.ResponseError("WRONGTYPE Operation against a key"), False),
        (FileNotFoundError("routes.toml"), False),
        (TypeError("a bug"), False),
    ],
)
def test_a_dependency_is_down_by_its_error_class_or_by_what_its_reply_says(
    exc: BaseException, is_down: bool
) -> None:
    """Loops that wait on a dependency wait on MISCONF and OOM replies too, never on a bug."""
    assert down(exc) is is_down


SECRET_TEXT = "host db.internal.example user svc_payments password hunter2 at 10.1.2.3"  # noqa: S105 - a made-up error text


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (psycopg.OperationalError(f"connection to {SECRET_TEXT} failed"), "connection_failed"),
        (pg.InvalidPassword(f"password authentication failed: {SECRET_TEXT}"), "sqlstate_28P01"),
        (pg.DiskFull(SECRET_TEXT), "sqlstate_53100"),
        (psycopg.InterfaceError(SECRET_TEXT), "client_error"),
        (KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, SECRET_TEXT)), "all_brokers_down"),
        (
            KafkaException(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, SECRET_TEXT)),
            "sasl_authentication_failed",
        ),
        (KafkaException(SECRET_TEXT), "kafka_error"),
        (redis.ResponseError(f"MISCONF {SECRET_TEXT}"), "misconf"),
        (redis.ResponseError(SECRET_TEXT), "error_reply"),
        (redis.ConnectionError(SECRET_TEXT), "connection_error"),
        (redis.exceptions.ClusterDownError(SECRET_TEXT), "cluster_down_error"),
        (OSError(SECRET_TEXT), "os_error"),
        (SchemaNotReadyError(SECRET_TEXT), "schema_not_ready"),
    ],
)
def test_readiness_reasons_are_codes_never_the_error_text(exc: Exception, code: str) -> None:
    """/readyz gets a SQLSTATE, a Kafka error name, a reply word or a class: no host or user."""
    assert reason(exc) == code
    assert not set(SECRET_TEXT.split()) & set(code.split("_"))


def test_inorders_own_outage_of_a_named_dependency_is_down_and_named() -> None:
    """A schema the owner has not migrated yet: waited out, unready on postgres, by its code."""
    from consumer.errors import SchemaNotReadyError  # noqa: PLC0415

    exc = SchemaNotReadyError("run inorder-consumer migrate")
    assert down(exc)
    assert dependency(exc) == "postgres"
    assert reason(exc) == "schema_not_ready"
