"""``emit`` inside a Django ``transaction.atomic()`` block, on Django's own connection.

Install with ``pip install 'inorder[django]'``. The events are checked as ``emit`` checks
them and inserted through the connection the block runs on (``using``), so they commit or
roll back with the models saved in it.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections

from schemas import PayloadSchemas
from schemas.errors import NotInTransactionError
from schemas.outbox.events import INSERT_RECORDS, OutboxEvent, checked, duplicate_of, records


def emit_many(
    events: Iterable[OutboxEvent],
    *,
    using: str = DEFAULT_DB_ALIAS,
    schemas: PayloadSchemas | None = None,
) -> None:
    """Write events in the open ``atomic()`` block of database ``using``; never commits.

    ``DuplicateEventError`` when the outbox already holds one of them (the block's
    transaction is aborted then: let the exception leave the block).
    """
    connection = connections[using]
    if not connection.in_atomic_block or connection.get_autocommit():
        raise NotInTransactionError(
            "emit needs the transaction that holds the state change: call it inside "
            f"`with transaction.atomic(using={using!r}):`"
        )
    batch = checked(events, schemas)
    if not batch:
        return
    try:
        with connection.cursor() as cursor:  # the batch in one statement, whatever its size
            cursor.execute(INSERT_RECORDS, [records(batch)])
    except IntegrityError as exc:
        raise duplicate_of(exc) or exc from exc


def emit(
    event: OutboxEvent, *, using: str = DEFAULT_DB_ALIAS, schemas: PayloadSchemas | None = None
) -> None:
    """Write one event in the open ``atomic()`` block of database ``using``."""
    emit_many((event,), using=using, schemas=schemas)
