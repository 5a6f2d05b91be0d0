"""``emit`` inside a SQLAlchemy 2 ``Session`` or ``AsyncSession`` transaction, and versioned models.

Install with ``pip install 'inorder[sqlalchemy]'``. The events are checked as ``emit`` checks
them and inserted through the session's own connection, so they commit or roll back with
the state change. ``bump`` changes a model's row and bumps its version in one
``UPDATE … RETURNING``: the event's seq comes from the statement that changed the row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, Connection, inspect, text, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Mapped, Session, mapped_column
from sqlalchemy.sql.dml import ReturningUpdate

from producer.errors import EntityNotFoundError, ProducerError
from producer.versioning import Version
from schemas import PayloadSchemas
from schemas.errors import NotInTransactionError
from schemas.outbox.events import INSERT_RECORDS_NAMED, OutboxEvent, checked, duplicate_of, records

_INSERT = text(INSERT_RECORDS_NAMED)  # the batch in one statement, whatever its size
_NOT_IN_TRANSACTION = (
    "emit needs the session's transaction that holds the state change: call it inside "
    "`with session.begin():` or after the statement that changed the entity"
)
_AUTOCOMMIT = (
    "emit needs a transaction, and this session's connection commits each statement on its "
    "own (isolation_level AUTOCOMMIT): use a session without it"
)


class VersionedMixin:
    """The two columns an entity's events are numbered by: its generation and its version.

    A new row starts at generation 1, version 1 (the first event's seq); ``bump`` moves it on.
    """

    generation: Mapped[int] = mapped_column(BigInteger, default=1, server_default="1")
    version: Mapped[int] = mapped_column(BigInteger, default=1, server_default="1")


def _refuse_autocommit(driver_connection: Any) -> None:
    if getattr(driver_connection, "autocommit", False) is True:
        raise NotInTransactionError(_AUTOCOMMIT)


def _connection(session: Session) -> Connection:
    if not session.in_transaction():
        raise NotInTransactionError(_NOT_IN_TRANSACTION)
    connection = session.connection()
    _refuse_autocommit(connection.connection.driver_connection)
    return connection


async def _async_connection(session: AsyncSession) -> AsyncConnection:
    if not session.in_transaction():
        raise NotInTransactionError(_NOT_IN_TRANSACTION)
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    _refuse_autocommit(raw.driver_connection)
    return connection


def _duplicate_raised(exc: sa_exc.IntegrityError) -> Exception:
    return duplicate_of(exc) or exc


def emit_many(
    session: Session, events: Iterable[OutboxEvent], *, schemas: PayloadSchemas | None = None
) -> None:
    """Write events in the session's transaction; never commits, flushes or rolls back.

    ``DuplicateEventError`` when the outbox already holds one of them (the session's
    transaction is aborted then: roll it back).
    """
    batch = checked(events, schemas)
    connection = _connection(session)
    if not batch:
        return
    try:
        connection.execute(_INSERT, {"records": records(batch)})
    except sa_exc.IntegrityError as exc:
        raise _duplicate_raised(exc) from exc


def emit(session: Session, event: OutboxEvent, *, schemas: PayloadSchemas | None = None) -> None:
    """Write one event in the session's transaction."""
    emit_many(session, (event,), schemas=schemas)


async def emit_many_async(
    session: AsyncSession,
    events: Iterable[OutboxEvent],
    *,
    schemas: PayloadSchemas | None = None,
) -> None:
    """``emit_many`` for an ``AsyncSession``."""
    batch = checked(events, schemas)
    connection = await _async_connection(session)
    if not batch:
        return
    try:
        await connection.execute(_INSERT, {"records": records(batch)})
    except sa_exc.IntegrityError as exc:
        raise _duplicate_raised(exc) from exc


async def emit_async(
    session: AsyncSession, event: OutboxEvent, *, schemas: PayloadSchemas | None = None
) -> None:
    """Write one event in the ``AsyncSession``'s transaction."""
    await emit_many_async(session, (event,), schemas=schemas)


def _bump_statement(model: type[Any], key: Any, values: Mapping[str, Any]) -> ReturningUpdate[Any]:
    mapper = inspect(model)
    missing = [c for c in ("generation", "version") if c not in mapper.columns]
    if missing:
        raise ProducerError(
            f"{model.__name__} has no {' or '.join(missing)} column: add VersionedMixin"
        )
    [primary] = mapper.primary_key
    where: list[ColumnElement[bool]] = [primary == key]
    if "deleted" in mapper.columns:
        where.append(mapper.columns["deleted"].is_(False))
    return (
        update(model)
        .where(*where)
        .values(version=mapper.columns["version"] + 1, **values)
        .returning(mapper.columns["generation"], mapper.columns["version"])
    )


def _version(model: type[Any], key: Any, row: Any) -> Version:
    if row is None:
        raise EntityNotFoundError(f"{model.__name__} {key!r} does not exist or is deleted")
    return Version(row[0], row[1])


def bump(session: Session, model: type[Any], key: Any, **values: Any) -> Version:
    """Set ``values`` on the row of ``model`` whose primary key is ``key`` and bump its version.

    One ``UPDATE … RETURNING`` in the session's transaction: the returned
    ``Version(generation, seq)`` is the event's. The row lock it takes orders concurrent
    writers, so their versions are distinct and gap-free in commit order. A model with a
    ``deleted`` column is bumped only while it is false.
    """
    result = session.execute(_bump_statement(model, key, values))
    return _version(model, key, result.one_or_none())


async def bump_async(session: AsyncSession, model: type[Any], key: Any, **values: Any) -> Version:
    """``bump`` for an ``AsyncSession``."""
    result = await session.execute(_bump_statement(model, key, values))
    return _version(model, key, result.one_or_none())
