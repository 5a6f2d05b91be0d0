"""Outbox rows and the Kafka messages made from them: pure, no I/O.

Rows and messages are plain tuples on the publishing path: a relay makes them by the
hundred thousand a second, and a named tuple per row (built by a Python call, read by
attribute) cost more than making the message itself. ``OutboxRow`` names the same
positions where a row is looked at one at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

import orjson

from outbox_relay.errors import RowProblem
from schemas import (
    PayloadError,
    PayloadSchemas,
    UnknownEventTypeError,
    cloudevents,
    encode_rendered,
    headers,
    kafka_key,
    rendered_types,
)
from schemas.limits import MAX_PAYLOAD_DEPTH, text_problem
from schemas.runtime.causes import Cause, cause

# The columns every query of rows selects, in OutboxRow's order, up to the slice. The
# payload and the creation time come as JSON text and go into the envelope as they are;
# the payload is parsed only when a schema checks it. Empty headers (the usual case) come
# as NULL, the others as JSON text, parsed here one row at a time (so a row whose headers
# no parser takes fails alone, not the read). The transaction id is named apart from its
# column, so that ORDER BY xid still means the column (and its index).
FIELDS = (
    "id, topic, entity_type, entity_id, generation, seq, event_type, event_id, "
    "payload::text AS payload, nullif(headers, '{}'::jsonb)::text AS headers, "
    "to_json(created_at)::text AS occurred_at"
)
TRANSACTION = "xid::text::bigint AS txid"
COLUMNS = f"{FIELDS}, outbox_slice(entity_type, entity_id) AS slice, {TRANSACTION}"

# Positions in a row.
ID: Final = 0
TOPIC: Final = 1
OCCURRED_AT: Final = 10
SLICE: Final = 11
XID: Final = 12

# A payload shorter than this cannot nest past its limit.
_DEEP_CHARS = 2 * MAX_PAYLOAD_DEPTH

# How many fields an OutboxRow has.
_FIELDS: Final = XID + 1

# Every row as read: OutboxRow's fields, in its order, and after them, where a read
# weighed it, its cut mark (``weighing``).
Row = tuple[Any, ...]

Header = tuple[str, str | bytes | None]

# What goes to Kafka for one row: (row id, topic, key, value, headers).
Message = tuple[int, str, bytes, bytes, list[Header]]

# Where the row id, the topic, the value and the headers sit in a Message.
MESSAGE_ROW_ID: Final = 0
MESSAGE_TOPIC: Final = 1
MESSAGE_VALUE: Final = 3
MESSAGE_HEADERS: Final = 4


class OutboxRow(NamedTuple):
    """One outbox row, by name (a ``Row`` holds the same values in the same places).

    ``payload`` is the JSON text of an object (None where a read left it unread, being
    longer than any message may be), ``occurred_at`` the JSON text of the
    creation time (a quoted timestamp), ``headers`` None when the row has none;
    ``slice`` is the entity's slice and ``xid`` the id of the transaction that wrote it.
    """

    id: int
    topic: str
    entity_type: str
    entity_id: str
    generation: int
    seq: int
    event_type: str
    event_id: str
    payload: str
    headers: Any
    occurred_at: str
    slice: int
    xid: int


def named(row: Row) -> OutboxRow:
    """``row`` with its fields named (a read's cut mark after them left out)."""
    return row if isinstance(row, OutboxRow) else OutboxRow._make(row[:_FIELDS])


def _headers(
    event_type: str,
    entity_type: str,
    row_headers: Any = None,
    republish_request: str | None = None,
) -> list[Header]:
    # The two types go as bytes: a str value is encoded again on every produce call.
    out: list[Header] = [
        (headers.EVENT_TYPE, event_type.encode()),
        (headers.ENTITY_TYPE, entity_type.encode()),
    ]
    if row_headers is not None:
        parsed = _parsed_headers(row_headers)
        if not isinstance(parsed, Mapping) or not all(isinstance(v, str) for v in parsed.values()):
            raise RowProblem("bad_headers", "headers must be a JSON object of strings")
        out.extend(parsed.items())
    if republish_request is not None:
        out.append((headers.REPUBLISH_REQUEST, republish_request))
    return out


def _refuse_identity(found: list[Header]) -> None:
    """A row may add CloudEvents extensions, never say which event it is or where it stands."""
    for name, _ in found:
        if name.lower() in cloudevents.IDENTITY:
            detail = f"header {name[:40]} is a CloudEvents attribute the relay writes itself"
            raise RowProblem("bad_headers", detail)


def _parsed_headers(row_headers: Any) -> Any:
    """Headers as read (JSON text) parsed; ones no parser on the way can take are refused."""
    if not isinstance(row_headers, str | bytes):
        return row_headers
    try:
        return orjson.loads(row_headers)
    except orjson.JSONDecodeError as exc:
        raise RowProblem("bad_headers", f"headers cannot be parsed: {exc}") from exc


def _parsed(payload: str) -> Any:
    """The payload parsed as the consumers will; one they cannot read is refused here."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:  # a number past a double, which jsonb holds
        raise RowProblem("not_json", f"the consumers cannot read the payload: {exc}") from exc


def _schema_problem(schemas: PayloadSchemas, event_type: str, payload: str) -> RowProblem:
    try:
        schemas.validate(event_type, orjson.loads(payload))
    except UnknownEventTypeError as exc:
        return RowProblem("unknown_type", exc.detail)
    except PayloadError as exc:
        return RowProblem("payload_schema", exc.detail)
    return RowProblem("payload_schema", "the payload does not match its schema")


class _Maker:
    """Makes one row's message; what is shared by a batch's rows is made once and kept."""

    def __init__(
        self,
        published_at: str,
        schemas: PayloadSchemas,
        max_bytes: int,
        republish_request: str | None,
        topic_problems: Mapping[str, RowProblem],
        cloudevents: bool = False,
    ) -> None:
        self.published_at = published_at
        # A CloudEvent carries the time as a header's text, not JSON: unquoted once a batch.
        self.published_text = orjson.loads(published_at) if cloudevents else None
        self.schemas = schemas
        self.validator = schemas.validators().get
        self.max_bytes = max_bytes
        self.republish_request = republish_request
        self.topic_problems = topic_problems
        # What every row of one (event, entity) type pair shares: the envelope's type
        # fields, and the header list of rows without headers of their own (the producer
        # copies headers as it takes a message).
        self.shared: dict[tuple[str, str], tuple[str, list[Header]]] = {}

    def make(self, row: Row) -> Message:
        """The row's message; ``RowProblem`` saying why it can never be sent."""
        (
            row_id, topic, entity_type, entity_id, generation, seq,
            event_type, event_id, payload, row_headers, occurred_at,
        ) = row[:SLICE]  # fmt: skip
        if topic in self.topic_problems:
            raise self.topic_problems[topic]
        if payload is None:  # left unread: its text alone is more than a message may hold
            raise RowProblem("too_large", f"payload and headers are over {self.max_bytes} bytes")
        # jsonb holds no NUL and no lone surrogate: only nesting is left to look for, and
        # only in a payload long enough to nest that deep (two characters a level).
        if len(payload) > _DEEP_CHARS:
            beyond = text_problem(payload, "payload", MAX_PAYLOAD_DEPTH)
            if beyond is not None:
                raise RowProblem(*beyond)
        check = self.validator(event_type)
        if check is None:
            if not self.schemas.allow_unknown:
                raise _schema_problem(self.schemas, event_type, payload)
        elif not check.is_valid(_parsed(payload)):
            raise _schema_problem(self.schemas, event_type, payload)
        pair = self.shared.get((event_type, entity_type))
        if pair is None:
            pair = rendered_types(event_type, entity_type), _headers(event_type, entity_type)
            self.shared[(event_type, entity_type)] = pair
        types, found = pair
        if row_headers is not None or self.republish_request is not None:
            found = _headers(event_type, entity_type, row_headers, self.republish_request)
        if self.published_text is not None:
            _refuse_identity(found)
            value = payload.encode()
            found = [
                *cloudevents.binary_headers(
                    event_id,
                    event_type,
                    (entity_type, entity_id, generation, seq),
                    orjson.loads(occurred_at),
                    self.published_text,
                ),
                *found,
            ]
            size = len(value) + sum(len(k) + len(v or b"") for k, v in found)
        else:
            value = encode_rendered(
                event_id,
                types,
                (entity_id, generation, seq),
                occurred_at,
                self.published_at,
                payload,
            )
            size = len(value)
        if size > self.max_bytes:
            raise RowProblem("too_large", f"message is {size} bytes, over {self.max_bytes}")
        return (row_id, topic, kafka_key(entity_type, entity_id), value, found)


def to_messages(
    rows: Iterable[Row],
    published_at: str,
    *,
    schemas: PayloadSchemas,
    max_bytes: int,
    republish_request: str | None = None,
    topic_problems: Mapping[str, RowProblem] | None = None,
    cloudevents: bool = False,
) -> tuple[list[Message], list[tuple[Row, RowProblem]]]:
    """The Kafka message of every sendable row, and why each other row cannot be sent.

    ``published_at`` is JSON text (a quoted timestamp). The table's CHECK constraints
    already hold every envelope field to the contract and the payload to a JSON object;
    a payload is checked against its event type's schema (a type without one is refused
    ``unknown_type``, or passes unchecked when the registry allows unknown types), and
    against the limits of the stores and serializers downstream (``schemas.limits``). A
    row whose topic is in ``topic_problems`` cannot be sent either. With ``cloudevents``
    each message is a CloudEvent in binary mode (``schemas.cloudevents``). Whatever else one row
    raises refuses that row only. Messages keep the rows' order.
    """
    messages: list[Message] = []
    problems: list[tuple[Row, RowProblem]] = []
    maker = _Maker(
        published_at, schemas, max_bytes, republish_request, topic_problems or {}, cloudevents
    )
    for row in rows:
        try:
            messages.append(maker.make(row))
        except RowProblem as problem:
            problems.append((row, problem))
        except Exception as exc:  # the barrier: what one row raised refuses that row only
            if cause(exc) is not Cause.INPUT:
                raise
            problems.append((row, RowProblem("unsendable", f"{type(exc).__name__}: {exc}")))
    return messages, problems
