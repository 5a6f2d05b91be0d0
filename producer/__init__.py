"""The producer side: the outbox table, ``emit`` inside the caller's transaction, version helpers.

Typical use, in the transaction that changes the entity::

    with conn.transaction():
        version, _ = versioning.bump(conn, "subscriptions", sub_id, set_values={"plan": "pro"})
        emit(conn, OutboxEvent("subscription", sub_id, version.seq, "subscription.plan_changed",
                               payload, generation=version.generation))
"""

try:  # an application's own module named schemas would hide inorder's: say so in one line
    from schemas import PACKAGES  # noqa: F401
except ImportError as exc:
    raise ImportError(
        f"inorder: {exc.path or 'an application module'} is named schemas and hides inorder's "
        "package of that name; rename it"
    ) from None


from producer.errors import EntityExistsError, EntityNotFoundError, ProducerError
from producer.versioning import Version
from schemas.errors import DuplicateEventError, InvalidEventError, NotInTransactionError
from schemas.outbox import OutboxEvent, emit, emit_async, emit_many, emit_many_async

__all__ = [
    "DuplicateEventError",
    "EntityExistsError",
    "EntityNotFoundError",
    "InvalidEventError",
    "NotInTransactionError",
    "OutboxEvent",
    "ProducerError",
    "Version",
    "emit",
    "emit_async",
    "emit_many",
    "emit_many_async",
]
