"""Each outbox writer only its own streams: the pairs ``outbox_writers`` lists for a role
(or a role it is a member of), checked once per statement; the owner, and any role that
may grant INSERT on the outbox, unchecked."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from consumer import tables
from producer import migrate
from schemas.outbox import OutboxEvent, emit, emit_many
from schemas.security import Roles, postgres_grants
from tests.conftest import PgSchema

RESULT = {"batch_id": "b1", "position": 1, "item_key": "k", "result_ref": "r"}
DELETED = {"plan": "pro", "price_cents": 100, "status": "deleted"}
NAMES = [field.name for field in dataclasses.fields(Roles)]

INSERT = (
    "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, payload) "
    "VALUES ('t', %s, %s, %s, %s, %s, '{}')"
)


@pytest.fixture
def roles(pg_schema: PgSchema) -> Iterator[Roles]:
    """Roles of this test's own (roles are the cluster's), granted as ``schemas.security``
    says for a producer of ``ledger`` and a batch route; dropped afterwards."""
    tag = uuid.uuid4().hex[:8]
    made = Roles(*(f"w{tag}_{name}" for name in NAMES))
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn, (tables.CONSUMER, migrate.OUTBOX))
        for role in (getattr(made, name) for name in NAMES):
            conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        for statement in postgres_grants(
            made, pg_schema.name, streams=["ledger"], batch_streams=["batch"]
        ):
            conn.execute(statement.encode())
    yield made
    with pg_schema.connect(autocommit=True) as conn:
        for role in (getattr(made, name) for name in NAMES):
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@contextmanager
def _role(pg_schema: PgSchema, role: str, grants: sql.Composable | None = None) -> Iterator[str]:
    """A role of this test's own with ``grants`` run as the owner; dropped afterwards."""
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        if grants is not None:
            conn.execute(grants)
    try:
        yield role
    finally:
        with pg_schema.connect(autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _as(pg_schema: PgSchema, role: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(pg_schema.conninfo)
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return conn


def _write(conn: psycopg.Connection[Any], *rows: tuple[str, str, str]) -> None:
    conn.cursor().executemany(
        INSERT,
        [
            (etype, eid, n, kind, f"{etype}:{eid}:{n}")
            for n, (etype, eid, kind) in enumerate(rows, 1)
        ],
    )


def _count(pg_schema: PgSchema) -> int:
    with pg_schema.connect() as conn:
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return int(row[0]) if row else -1


@pytest.mark.parametrize(
    ("entity_type", "event_type"),
    [
        ("ledger", "ledger.added"),  # another stream's events
        ("ledger", "ledger.snapshot"),  # a snapshot that would move a baseline
        ("batch", "batch.accepted"),  # a forged manifest
        ("batch_item", "batch.work_item"),  # a forged work item
        ("batch_result", "batch.item_lost"),  # a result kind it is not granted
    ],
)
def test_a_worker_writing_outside_its_grant_is_refused_in_one_line_naming_it(
    pg_schema: PgSchema, roles: Roles, entity_type: str, event_type: str
) -> None:
    """A worker may write batch results only; anything else is refused with 42501."""
    with (
        _as(pg_schema, roles.worker) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege) as refused,
    ):
        _write(conn, (entity_type, "e1", event_type))
    assert refused.value.diag.message_primary == (
        f"role {roles.worker} may not write {event_type} events of entity type "
        f"{entity_type} to the outbox"
    )
    hint = refused.value.diag.message_hint or ""
    assert f"VALUES ('{roles.worker}', '{entity_type}', '{event_type}')" in hint
    assert _count(pg_schema) == 0


def test_each_role_writes_what_it_is_granted(pg_schema: PgSchema, roles: Roles) -> None:
    """The producer its stream (any event type, snapshots too), manifests and work items;
    a worker its results; a consumer assembled batches and re-dispatched items."""
    granted = {
        roles.producer: [
            ("ledger", "e1", "ledger.added"),
            ("ledger", "e1", "ledger.snapshot"),
            ("batch", "b1", "batch.accepted"),
            ("batch_item", "b1#0", "batch.work_item"),
        ],
        roles.worker: [
            ("batch_result", "b1#0", "batch.item_succeeded"),
            ("batch_result", "b1#1", "batch.item_failed"),
        ],
        roles.consumer: [
            ("batch", "b2", "batch.assembled"),
            ("batch_item", "b2#0", "batch.work_item"),
        ],
        roles.sweeper: [("batch_item", "b3#0", "batch.work_item")],
    }
    for role, rows in granted.items():
        with _as(pg_schema, role) as conn:
            _write(conn, *rows)
    assert _count(pg_schema) == sum(len(rows) for rows in granted.values())


def test_a_statement_with_one_refused_row_inserts_none(pg_schema: PgSchema, roles: Roles) -> None:
    """emit_many of a granted row and a refused one leaves the outbox as it was."""
    events = [
        OutboxEvent("batch_result", "b1#1", 1, "batch.item_succeeded", RESULT, topic="t"),
        OutboxEvent("subscription", "s1", 1, "subscription.deleted", DELETED, topic="t"),
    ]
    with (
        _as(pg_schema, roles.worker) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"subscription\.deleted"),
    ):
        emit_many(conn, events)
    with _as(pg_schema, roles.worker) as conn:
        emit(conn, events[0])  # the granted row alone goes in
    assert _count(pg_schema) == 1


def test_a_login_role_writes_through_the_group_role_it_is_a_member_of(
    pg_schema: PgSchema, roles: Roles
) -> None:
    """Grants name group roles; a login role in the group may write what the group may."""
    member = f"{roles.producer}_login"
    joined = sql.SQL("GRANT {} TO {}").format(
        sql.Identifier(roles.producer), sql.Identifier(member)
    )
    with _role(pg_schema, member, joined), _as(pg_schema, member) as conn:
        _write(conn, ("ledger", "e1", "ledger.added"))
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=member):
            _write(conn, ("batch_result", "b1#0", "batch.item_succeeded"))
    assert _count(pg_schema) == 1


def test_the_owner_writes_any_stream_without_a_row(pg_schema: PgSchema, roles: Roles) -> None:
    """A deployment writing as the outbox's owner sees no change."""
    with pg_schema.connect() as conn:
        _write(conn, ("anything", "e1", "anything.at_all"), ("batch_result", "x#0", "z"))
        conn.commit()
    assert _count(pg_schema) == 2


def test_a_role_that_may_grant_insert_writes_any_stream_without_a_row(
    pg_schema: PgSchema, roles: Roles
) -> None:
    """Given INSERT WITH GRANT OPTION, a role could let any role write: it is not checked."""
    role = f"w{uuid.uuid4().hex[:8]}_granting"
    grants = sql.SQL(
        "GRANT USAGE ON SCHEMA {s} TO {r}; "
        "GRANT INSERT ON outbox TO {r} WITH GRANT OPTION; "
        "GRANT USAGE ON SEQUENCE outbox_id_seq TO {r}"
    ).format(s=sql.Identifier(pg_schema.name), r=sql.Identifier(role))
    with _role(pg_schema, role, grants), _as(pg_schema, role) as conn:
        _write(conn, ("anything", "e1", "anything.at_all"), ("batch", "b1", "batch.accepted"))
        conn.commit()
    assert _count(pg_schema) == 2


def test_runtime_roles_read_the_migration_ledger_and_never_write_it(
    pg_schema: PgSchema, roles: Roles
) -> None:
    """A compromised consumer cannot mark a future outbox migration applied."""
    for role in (roles.consumer, roles.sweeper, roles.admin, roles.producer, roles.relay):
        with _as(pg_schema, role) as conn:
            assert conn.execute("SELECT count(*) FROM inorder_migrations").fetchone()
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    "INSERT INTO inorder_migrations (migration_set, version, name) "
                    "VALUES ('outbox', 99, 'forged')"
                )


def test_upgrading_lists_every_role_that_could_already_insert_as_any(
    pg_schema: PgSchema,
) -> None:
    """Migration 0008 keeps today's writers writing until the owner narrows them."""
    role = f"w{uuid.uuid4().hex[:8]}_old_producer"
    shipped = migrate.available(migrate.OUTBOX)
    with _role(pg_schema, role), pg_schema.connect(autocommit=True) as conn:
        with conn.transaction():
            conn.execute(
                "CREATE TABLE inorder_migrations (migration_set text, version integer, "
                "name text, applied_at timestamptz DEFAULT now(), "
                "PRIMARY KEY (migration_set, version))"
            )
            for migration in (m for m in shipped if m.version < 8):
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO inorder_migrations (migration_set, version, name) "
                    "VALUES (%s, %s, %s)",
                    (migration.migration_set, migration.version, migration.name),
                )
        conn.execute(
            sql.SQL(
                "GRANT USAGE ON SCHEMA {s} TO {r}; GRANT INSERT ON outbox TO {r}; "
                "GRANT USAGE ON SEQUENCE outbox_id_seq TO {r}"
            ).format(s=sql.Identifier(pg_schema.name), r=sql.Identifier(role))
        )
        applied = [m.version for m in migrate.apply(conn)]
        assert applied[:1] == [8]
        rows = conn.execute("SELECT role, entity_type, event_type FROM outbox_writers").fetchall()
        assert rows == [(role, "*", "*")]
        with _as(pg_schema, role) as writer:
            _write(writer, ("any", "e1", "any.thing"))
            writer.commit()
    assert _count(pg_schema) == 1
