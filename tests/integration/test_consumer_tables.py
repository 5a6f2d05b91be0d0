"""The consumer's own tables: versioned migrations, an in-place upgrade, statuses tied to CHECKs."""

from __future__ import annotations

import threading
from enum import StrEnum
from pathlib import Path

import pytest

from consumer import tables
from consumer.kinds import KINDS
from consumer.kinds.steps.gaps import GapStatus
from schemas.batches import Action, BatchStatus, ItemState, OnIncomplete
from schemas.runtime import migrate
from tests.conftest import PgSchema
from tests.support.services import ROOT

PREVIOUS_RELEASE = Path(__file__).parent / "data" / "consumer_tables_0.1.0.sql"

# One row in every table, as the previous release wrote them.
ROWS = [
    "INSERT INTO inorder_dead_letters (entity_type, entity_id, generation, seq, event_id, reason,"
    " detail, topic, kafka_partition, kafka_offset) VALUES"
    " ('acct', 'a1', 1, 3, 'e3', 'projection_rejected', 'too long', 'events', 0, 42)",
    "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied,"
    " stopped_at_seq, stop_reason) VALUES ('ledger', 'l1', 2, 7, 8, 'needs_review: call')",
    "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, event_type)"
    " VALUES ('ledger', 'l1', 2, 7, 'e7', 'ledger.added')",
    "INSERT INTO inorder_step_skips (route, entity_id, generation, from_seq, to_seq,"
    " skipped_by, reason) VALUES ('ledger', 'l1', 2, 3, 4, 'ops', 'never sent')",
    "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id)"
    " VALUES ('ledger', 'l1', 2, 8, 'e8')",
    "INSERT INTO inorder_gaps (route, entity_id, generation, from_seq, to_seq, event_type,"
    " status) VALUES ('ledger', 'l2', 1, 5, 6, 'ledger.added', 'requested')",
    "INSERT INTO inorder_batches (route, batch_id, generation, expected_count, digest,"
    " on_incomplete, deadline_s, deadline_at, status) VALUES"
    " ('batch', 'b1', 1, 2, 'd', 'hold', 60, now(), 'held')",
    "INSERT INTO inorder_batch_items (route, batch_id, position, item_key, state)"
    " VALUES ('batch', 'b1', 1, 'k1', 'done'), ('batch', 'b1', 2, 'k2', 'failed')",
    "INSERT INTO inorder_batch_early_results (route, batch_id, event_id, attempt, event_type,"
    " payload) VALUES ('batch', 'b9', 'r1', 1, 'batch.item_succeeded', '{}')",
    "INSERT INTO inorder_batch_actions (route, batch_id, position, action, done_by, reason)"
    " VALUES ('batch', 'b1', 2, 'retried', 'ops', 'worker fixed')",
]
TABLES = [
    "inorder_dead_letters",
    "inorder_step_progress",
    "inorder_step_log",
    "inorder_step_skips",
    "inorder_step_attempts",
    "inorder_gaps",
    "inorder_batches",
    "inorder_batch_items",
    "inorder_batch_early_results",
    "inorder_batch_actions",
]


def _contents(schema: PgSchema) -> dict[str, list[tuple[object, ...]]]:
    with schema.connect() as conn:
        return {
            t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall()  # noqa: S608
            for t in TABLES
        }


def test_a_database_of_the_previous_release_upgrades_in_place(pg_schema: PgSchema) -> None:
    """Tables made by the release before migrations, with data, upgrade with every row kept."""
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(PREVIOUS_RELEASE.read_text().encode())
        for row in ROWS:
            conn.execute(row.encode())
    before = _contents(pg_schema)
    with pg_schema.connect(autocommit=True) as conn:
        applied = tables.migrate(conn)
        again = tables.migrate(conn)
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes").fetchall()}
        ledger = conn.execute(
            "SELECT version, name FROM inorder_migrations WHERE migration_set = 'consumer' "
            "ORDER BY version"
        ).fetchall()
    assert [m.version for m in applied] == [m.version for m in migrate.available(tables.CONSUMER)]
    assert again == []
    after = _contents(pg_schema)  # columns added since come after the old ones
    assert {t: [r[: len(before[t][0])] for r in rows] for t, rows in after.items()} == before
    assert {
        "inorder_step_progress_stopped",
        "inorder_step_progress_held",
        "inorder_step_progress_parked_ahead",
    } <= indexes
    assert [v for v, _ in ledger] == [m.version for m in applied]


def test_the_upgraded_database_holds_the_new_constraints(pg_schema: PgSchema) -> None:
    """After the upgrade, an action outside the known decisions is refused."""
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(PREVIOUS_RELEASE.read_text().encode())
        tables.migrate(conn)
        with pytest.raises(Exception, match="inorder_batch_actions_action_check"):
            conn.execute(
                "INSERT INTO inorder_batch_actions (route, batch_id, action, done_by, reason) "
                "VALUES ('batch', 'b1', 'deleted', 'ops', 'x')"
            )


def test_consumers_starting_at_once_apply_each_migration_once(pg_schema: PgSchema) -> None:
    """Four processes migrating at once apply each of the consumer's files exactly once."""
    applied: list[int] = []

    def run() -> None:
        with pg_schema.connect(autocommit=True) as conn:
            applied.append(len(tables.migrate(conn)))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(applied) == [0, 0, 0, len(migrate.available(tables.CONSUMER))]


def test_a_batch_route_gives_the_consumer_database_an_outbox(pg_schema: PgSchema) -> None:
    """A batch route gives the consumer's database an outbox; consumer/README.md says so."""
    with pg_schema.connect(autocommit=True) as conn:
        tables.migrate(conn, tables.migration_sets([KINDS["batch"]]))
        found = conn.execute("SELECT to_regclass('outbox') IS NOT NULL").fetchone()
    assert found == (True,)
    readme = " ".join((ROOT / "consumer" / "README.md").read_text().split())
    assert "a consumer with a batch route has an `outbox` table in its own database" in readme
    assert "needs a relay whose `DATABASE_URL` is that database" in readme


@pytest.mark.parametrize(
    ("table", "column", "enum"),
    [
        ("inorder_gaps", "status", GapStatus),
        ("inorder_batches", "status", BatchStatus),
        ("inorder_batches", "on_incomplete", OnIncomplete),
        ("inorder_batch_items", "state", ItemState),
        ("inorder_batch_actions", "action", Action),
    ],
)
def test_each_status_enum_matches_its_check_constraint(
    pg_schema: PgSchema, table: str, column: str, enum: type[StrEnum]
) -> None:
    """The values the code knows for a column are exactly those its CHECK constraint allows."""
    with pg_schema.connect(autocommit=True) as conn:
        tables.migrate(conn)
        allowed = conn.execute(
            "SELECT array_agg(DISTINCT m.v[1] ORDER BY m.v[1]) FROM pg_constraint c "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey), "
            "regexp_matches(pg_get_constraintdef(c.oid), '''([a-z_]+)''', 'g') AS m(v) "
            "WHERE c.contype = 'c' AND c.conrelid = %s::regclass AND a.attname = %s",
            (table, column),
        ).fetchone()
    assert allowed is not None
    assert allowed[0] == sorted(e.value for e in enum)
