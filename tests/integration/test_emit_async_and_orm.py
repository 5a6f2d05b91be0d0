"""emit from async psycopg, SQLAlchemy 2 (Session and AsyncSession) and Django, on real PostgreSQL.

Each writer joins the caller's transaction, refuses to run outside one, turns a duplicate
version into DuplicateEventError and checks events as emit does.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import String, create_engine
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from producer import (
    DuplicateEventError,
    EntityNotFoundError,
    InvalidEventError,
    NotInTransactionError,
    OutboxEvent,
    emit_async,
    emit_many_async,
)
from producer import sqlalchemy as orm
from tests.conftest import PgSchema
from tests.support.docs import PRODUCER, module_of

PAYLOAD = {"plan": "pro", "price_cents": 2900, "status": "active"}


def _event(seq: int, entity: str = "s1", **changes: Any) -> OutboxEvent:
    fields: dict[str, Any] = {
        "entity_type": "subscription",
        "entity_id": entity,
        "seq": seq,
        "event_type": "subscription.plan_changed",
        "payload": PAYLOAD,
    }
    return OutboxEvent(**{**fields, **changes})


def _outbox(schema: PgSchema) -> list[tuple[str, int, int, dict[str, Any]]]:
    with schema.connect() as conn:
        return conn.execute(
            "SELECT entity_id, generation, seq, payload FROM outbox ORDER BY id"
        ).fetchall()


# ---------------------------------------------------------------- psycopg AsyncConnection


def test_async_emit_joins_the_callers_transaction(outbox: PgSchema) -> None:
    """emit_async writes on commit, nothing on rollback, and refuses outside a transaction."""

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(outbox.conninfo) as conn:
            async with conn.transaction():
                await emit_async(conn, _event(1))
            with pytest.raises(NotInTransactionError):
                await emit_async(conn, _event(2))
            async with conn.transaction(force_rollback=True):
                await emit_many_async(conn, [_event(2), _event(3)])
            async with conn.transaction():
                with pytest.raises(InvalidEventError):
                    await emit_async(conn, _event(2, payload={"plan": 7}))

    asyncio.run(scenario())
    assert [(e, s) for e, _, s, _ in _outbox(outbox)] == [("s1", 1)]


def test_async_emit_turns_a_duplicate_into_duplicate_event_error(outbox: PgSchema) -> None:
    """A version written twice raises DuplicateEventError naming the constraint."""

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(outbox.conninfo) as conn:
            async with conn.transaction():
                await emit_async(conn, _event(1))
            with pytest.raises(DuplicateEventError) as caught:
                async with conn.transaction():
                    await emit_async(conn, _event(1, event_id="other-id"))
            assert caught.value.constraint

    asyncio.run(scenario())


# ---------------------------------------------------------------- SQLAlchemy


class Base(DeclarativeBase):
    """The test's models."""


class Subscription(orm.VersionedMixin, Base):
    """A versioned model: its version numbers its events."""

    __tablename__ = "subscriptions"
    id: Mapped[str] = mapped_column(String, primary_key=True)
    plan: Mapped[str] = mapped_column(String)
    deleted: Mapped[bool] = mapped_column(default=False)


def _sa_url(schema: PgSchema, driver: str = "psycopg") -> str:
    return schema.url.replace("postgresql://", f"postgresql+{driver}://", 1)


@pytest.fixture
def engine(outbox: PgSchema) -> Any:
    """A SQLAlchemy engine on the test's schema, with the model's table in it."""
    engine = create_engine(_sa_url(outbox))
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def _fail_after_emitting(engine: Any) -> None:
    with Session(engine) as session, session.begin():
        version = orm.bump(session, Subscription, "s1", plan="gold")
        orm.emit(session, _event(version.seq))
        raise RuntimeError("the request fails after emitting")


def test_sqlalchemy_emit_commits_with_the_models_change(outbox: PgSchema, engine: Any) -> None:
    """bump's UPDATE … RETURNING gives the seq; the event commits or rolls back with the row."""
    with Session(engine) as session, session.begin():
        session.add(Subscription(id="s1", plan="basic"))
        session.flush()
        orm.emit(session, _event(1))
    with Session(engine) as session, session.begin():
        version = orm.bump(session, Subscription, "s1", plan="pro")
        orm.emit(session, _event(version.seq, generation=version.generation))
    with pytest.raises(RuntimeError):
        _fail_after_emitting(engine)
    assert [(e, g, s) for e, g, s, _ in _outbox(outbox)] == [("s1", 1, 1), ("s1", 1, 2)]
    with Session(engine) as session:
        assert session.get(Subscription, "s1").version == 2  # type: ignore[union-attr]


def test_sqlalchemy_emit_refuses_outside_a_transaction(engine: Any) -> None:
    """A session that has begun nothing, or an AUTOCOMMIT connection, is refused."""
    with Session(engine) as session, pytest.raises(NotInTransactionError):
        orm.emit(session, _event(1))
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with (
        Session(autocommit) as session,
        session.begin(),
        pytest.raises(NotInTransactionError, match="AUTOCOMMIT"),
    ):
        orm.emit(session, _event(1))


def test_sqlalchemy_emit_turns_a_duplicate_into_duplicate_event_error(engine: Any) -> None:
    """A seq written twice raises DuplicateEventError; invalid events are refused unsent."""
    with Session(engine) as session, session.begin():
        orm.emit_many(session, [_event(1), _event(2)])
    with Session(engine) as session:
        session.begin()
        with pytest.raises(DuplicateEventError) as caught:
            orm.emit(session, _event(2, event_id="again"))
        assert "outbox" in (caught.value.constraint or "")
        session.rollback()
        session.begin()
        with pytest.raises(InvalidEventError):
            orm.emit(session, _event(3, entity_type="Bad:Type"))


def test_sqlalchemy_bump_refuses_a_missing_or_deleted_row(engine: Any) -> None:
    """bump of no row, or of a deleted one, raises EntityNotFoundError and changes nothing."""
    with Session(engine) as session, session.begin():
        session.add(Subscription(id="gone", plan="basic", deleted=True))
    with Session(engine) as session, session.begin():
        for key in ("missing", "gone"):
            with pytest.raises(EntityNotFoundError):
                orm.bump(session, Subscription, key, plan="pro")


def test_sqlalchemy_bumps_in_concurrent_sessions_number_events_without_gaps(
    outbox: PgSchema, engine: Any
) -> None:
    """Four threads bumping one row: every version once, and the outbox holds 1..N in order."""
    with Session(engine) as session, session.begin():
        session.add(Subscription(id="s1", plan="basic"))
        orm.emit(session, _event(1))

    def writer() -> None:
        for _ in range(15):
            with Session(engine) as session, session.begin():
                version = orm.bump(session, Subscription, "s1", plan="pro")
                orm.emit(session, _event(version.seq))

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(s for _, _, s, _ in _outbox(outbox)) == list(range(1, 62))


def test_sqlalchemy_async_session_emits_and_bumps(outbox: PgSchema, engine: Any) -> None:
    """An AsyncSession bumps and emits in one transaction; outside one it is refused."""
    with Session(engine) as session, session.begin():
        session.add(Subscription(id="s1", plan="basic"))

    async def scenario() -> None:
        async_engine = create_async_engine(_sa_url(outbox, "psycopg_async"))
        sessions = async_sessionmaker(async_engine)
        try:
            async with sessions() as session, session.begin():
                version = await orm.bump_async(session, Subscription, "s1", plan="pro")
                await orm.emit_async(session, _event(version.seq))
            async with sessions() as session:
                with pytest.raises(NotInTransactionError):
                    await orm.emit_async(session, _event(3))
            async with sessions() as session:
                await session.begin()
                with pytest.raises(DuplicateEventError):
                    await orm.emit_many_async(session, [_event(2, event_id="again")])
                await session.rollback()
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())
    assert [(e, s) for e, _, s, _ in _outbox(outbox)] == [("s1", 2)]


# ---------------------------------------------------------------- Django


@pytest.fixture(scope="module")
def django_outbox(services: Any) -> Any:
    """Django configured on a schema of this module's own, holding the outbox."""
    import django  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415

    schema = PgSchema(services.database_url, f"t_django_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema.name}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema.name}"')
    from tests.integration import relay_support  # noqa: PLC0415

    relay_support.prepare_outbox(schema)
    params = psycopg.conninfo.conninfo_to_dict(schema.conninfo)
    if not settings.configured:
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": params["dbname"],
                    "USER": params.get("user", ""),
                    "PASSWORD": params.get("password", ""),
                    "HOST": params.get("host", ""),
                    "PORT": params.get("port", ""),
                    "OPTIONS": {"options": params["options"]},
                }
            },
            USE_TZ=True,
        )
        django.setup()
    yield schema
    from django.db import connections  # noqa: PLC0415

    connections.close_all()
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema.name}" CASCADE')


def test_django_emit_commits_with_the_atomic_block(django_outbox: PgSchema) -> None:
    """emit inside atomic() commits with it, rolls back with it, and is refused outside it."""
    from django.db import connection, transaction  # noqa: PLC0415

    from producer import django as dj  # noqa: PLC0415

    with transaction.atomic():
        dj.emit(_event(1, entity="d1"))

    def failing_view() -> None:
        with transaction.atomic():
            dj.emit_many([_event(2, entity="d1"), _event(3, entity="d1")])
            raise RuntimeError("the view fails after emitting")

    with pytest.raises(RuntimeError):
        failing_view()
    with pytest.raises(NotInTransactionError, match="atomic"):
        dj.emit(_event(2, entity="d1"))
    with pytest.raises(DuplicateEventError), transaction.atomic():
        dj.emit(_event(1, entity="d1", event_id="again"))
    with pytest.raises(InvalidEventError), transaction.atomic():
        dj.emit(_event(2, entity="d1", payload={"plan": 7}))
    with connection.cursor() as cursor:
        cursor.execute("SELECT entity_id, seq FROM outbox WHERE entity_id = 'd1'")
        assert cursor.fetchall() == [("d1", 1)]


def test_the_readme_sqlalchemy_example_runs(outbox: PgSchema, tmp_path: Path) -> None:
    """producer/README.md's SQLAlchemy block, run as shown, bumps the row and emits."""
    shown = module_of("sqlalchemy-emit", tmp_path, PRODUCER)
    engine = create_engine(_sa_url(outbox))
    try:
        shown.Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            session.add(shown.Subscription(id="r1", plan="basic"))
        with Session(engine) as session:
            shown.change_plan(session, "r1", "pro", 2900)
    finally:
        engine.dispose()
    assert [(e, s, p["plan"]) for e, _, s, p in _outbox(outbox)] == [("r1", 2, "pro")]


def test_the_readme_django_example_runs(django_outbox: PgSchema, tmp_path: Path) -> None:
    """producer/README.md's Django block, run as shown, emits in its atomic block."""
    module_of("django-emit", tmp_path, PRODUCER).change_plan("readme-1", 4)
    with django_outbox.connect() as conn:
        rows = conn.execute("SELECT seq FROM outbox WHERE entity_id = 'readme-1'").fetchall()
    assert rows == [(4,)]
