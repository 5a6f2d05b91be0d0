"""What an error means for the process that met it: an outage, a bad input, or the operator's.

Every barrier asks ``cause`` once and acts on the answer:

- ``OUTAGE``: a dependency cannot serve now (connection lost, out of resources, shutting
  down, a transaction that lost a race). Pause, back off, try the same input again.
- ``INPUT``: what one input holds cannot be stored or sent (data, integrity, syntax, a
  program limit, a statement that ran past its timeout, a serializer's limit). Refuse
  that input with the reason and go on; retrying would fail the same way.
- ``OPERATOR``: something only the operator can fix (a permission taken away, a password
  refused, an object the configuration names that does not exist). The process stops
  with one line.

PostgreSQL errors are read by SQLSTATE (class first, then the few codes that differ
from their class), Kafka errors by code, Redis errors by class and by the reply's
first word. Anything else raised while handling one input belongs to that input.
"""

from __future__ import annotations

from enum import StrEnum

import psycopg
import redis
from confluent_kafka import KafkaError, KafkaException

from schemas.errors import OperatorError, OutageError


class Cause(StrEnum):
    """Why something failed, which decides what the process does next."""

    OUTAGE = "outage"
    INPUT = "input"
    OPERATOR = "operator"


# Every SQLSTATE class (the first two characters), by what it means here.
_PG_CLASSES: dict[str, Cause] = {
    "08": Cause.OUTAGE,  # connection exception
    "40": Cause.OUTAGE,  # transaction rollback: serialization failure, deadlock
    "53": Cause.OUTAGE,  # insufficient resources: disk full, out of memory, too many connections
    "55": Cause.OUTAGE,  # object not in prerequisite state: lock not available
    "57": Cause.OUTAGE,  # operator intervention: admin shutdown, crash shutdown, cannot connect now
    "58": Cause.OUTAGE,  # system error: I/O error
    "72": Cause.OUTAGE,  # snapshot too old: the same read later works
    "XX": Cause.OUTAGE,  # internal error: the server's, not the input's
    "HV": Cause.OUTAGE,  # foreign data wrapper: a remote server behind a table
    "22": Cause.INPUT,  # data exception: NUL in text, value out of range, bad JSON
    "23": Cause.INPUT,  # integrity constraint violation
    "42": Cause.INPUT,  # syntax error or access rule violation
    "54": Cause.INPUT,  # program limit exceeded: too complex, too many columns, row too big
    "21": Cause.INPUT,  # cardinality violation: one row's values hit one key twice
    "44": Cause.INPUT,  # WITH CHECK OPTION violation
    "25": Cause.INPUT,  # invalid transaction state: a transaction an earlier input aborted
    "09": Cause.INPUT,  # triggered action exception
    "2F": Cause.INPUT,  # SQL routine exception (a function the input ran)
    "38": Cause.INPUT,  # external routine exception
    "39": Cause.INPUT,  # external routine invocation exception
    "P0": Cause.INPUT,  # PL/pgSQL raise (a trigger refusing the row)
    "20": Cause.INPUT,  # case not found (in a function the input ran)
    "02": Cause.INPUT,  # no data
    "03": Cause.INPUT,  # SQL statement not yet complete
    "0B": Cause.INPUT,  # invalid transaction initiation
    "0F": Cause.INPUT,  # locator exception
    "0Z": Cause.INPUT,  # diagnostics exception
    "10": Cause.INPUT,  # XQuery error
    "24": Cause.INPUT,  # invalid cursor state
    "26": Cause.INPUT,  # invalid SQL statement name
    "27": Cause.INPUT,  # triggered data change violation
    "2B": Cause.INPUT,  # dependent privilege descriptors still exist
    "2D": Cause.INPUT,  # invalid transaction termination
    "34": Cause.INPUT,  # invalid cursor name
    "3B": Cause.INPUT,  # savepoint exception
    "28": Cause.OPERATOR,  # invalid authorization: the password or user is refused
    "3D": Cause.OPERATOR,  # invalid catalog name: the database does not exist
    "3F": Cause.OPERATOR,  # invalid schema name: the configured schema is gone
    "0A": Cause.OPERATOR,  # feature not supported by this server
    "0L": Cause.OPERATOR,  # invalid grantor
    "0P": Cause.OPERATOR,  # invalid role specification
    "F0": Cause.OPERATOR,  # configuration file error
}
# Codes whose meaning differs from their class.
_PG_CODES: dict[str, Cause] = {
    "57014": Cause.INPUT,  # query_canceled: a statement timeout spent on one input
    "42501": Cause.OPERATOR,  # insufficient_privilege: a grant is missing
    "42P01": Cause.OPERATOR,  # undefined_table: a table the routes name was dropped
    "42703": Cause.OPERATOR,  # undefined_column: a column the routes name was dropped
    # A statement's shape, never a value, meets these: a table changed under it.
    "42P10": Cause.OPERATOR,  # invalid_column_reference: ON CONFLICT's unique index is gone
    "42804": Cause.OPERATOR,  # datatype_mismatch: a column's type changed
    "42883": Cause.OPERATOR,  # undefined_function: no operator or function for new types
    "53100": Cause.OUTAGE,  # disk_full
}

_KAFKA_INPUT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.TOPIC_EXCEPTION,  # an invalid topic name
        KafkaError.TOPIC_AUTHORIZATION_FAILED,  # the topic one row names is not ours to write
        KafkaError._INVALID_ARG,
        KafkaError.INVALID_REQUIRED_ACKS,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError._BAD_MSG,
        KafkaError._KEY_SERIALIZATION,
        KafkaError._VALUE_SERIALIZATION,
    }
)
_KAFKA_OPERATOR = frozenset(
    {
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
        KafkaError._INVALID_TYPE,
        KafkaError._FATAL,
    }
)

# Redis errors that mean the server or the cluster cannot serve now.
REDIS_OUTAGES = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.MasterDownError,
)
# Redis replies that mean the server cannot take writes now, not that the command is bad.
_REDIS_OUTAGE_REPLIES = (
    "MISCONF",
    "OOM",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
)
_REDIS_OPERATOR_REPLIES = ("NOPERM", "NOAUTH", "WRONGPASS")


def postgres_cause(sqlstate: str | None) -> Cause:
    """The cause a PostgreSQL error code names; no code at all is a lost connection.

    A class PostgreSQL adds later is taken as the input's: refused and seen, never waited
    on forever.
    """
    if not sqlstate:
        return Cause.OUTAGE
    return _PG_CODES.get(sqlstate) or _PG_CLASSES.get(sqlstate[:2], Cause.INPUT)


def kafka_cause(code: int) -> Cause:
    """The cause a Kafka error code names; anything not known to be permanent is waited out."""
    if code in _KAFKA_INPUT:
        return Cause.INPUT
    if code in _KAFKA_OPERATOR:
        return Cause.OPERATOR
    return Cause.OUTAGE


def reply_code(exc: redis.RedisError) -> str | None:
    """The code a Redis error reply starts with (``MISCONF``, ``NOPERM`` ...), or None when
    its first word is not one: the rest of a reply may name keys, users or hosts."""
    word = str(exc).split(" ", 1)[0]
    return word if word.isalpha() and word.isupper() else None


def redis_cause(exc: redis.RedisError | redis.exceptions.RedisClusterException) -> Cause:
    """The cause of a Redis error: by class, then by the first word of the server's reply."""
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return Cause.OPERATOR
    if isinstance(exc, REDIS_OUTAGES):
        return Cause.OUTAGE
    if isinstance(exc, redis.ResponseError | redis.exceptions.DataError):
        word = str(exc).split(" ", 1)[0].upper()
        if word in _REDIS_OPERATOR_REPLIES:
            return Cause.OPERATOR
        if word in _REDIS_OUTAGE_REPLIES:
            return Cause.OUTAGE
        return Cause.INPUT
    return Cause.OUTAGE  # connection, timeout, cluster reshaping, a failover under way


def _postgres(exc: psycopg.Error) -> Cause:
    client_side = not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    if exc.sqlstate is None and client_side:
        return Cause.INPUT  # a value psycopg cannot adapt, refused before it was sent
    return postgres_cause(exc.sqlstate)


def _kafka(exc: KafkaException) -> Cause:
    err = exc.args[0] if exc.args else None
    return kafka_cause(err.code()) if isinstance(err, KafkaError) else Cause.OUTAGE


def cause(exc: BaseException) -> Cause:
    """Classify any exception met while handling one input."""
    if isinstance(exc, OutageError | MemoryError | OSError):
        return Cause.OUTAGE  # OSError: a socket or a file the process needs
    if isinstance(exc, OperatorError):
        return Cause.OPERATOR
    if isinstance(exc, psycopg.Error):
        return _postgres(exc)
    if isinstance(exc, KafkaException):
        return _kafka(exc)
    if isinstance(exc, redis.RedisError | redis.exceptions.RedisClusterException):
        return redis_cause(exc)
    return Cause.INPUT
