"""The consumer's history past its retention is deleted, a bounded slice at a time; what
still matters (open letters, unresolved gaps, unfinished calls, progress) never is."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from prometheus_client import REGISTRY
from psycopg import sql

from consumer import tables
from consumer.sweeper import history
from tests.conftest import PgSchema, TopicFactory
from tests.integration import sweeper_support as sw
from tests.support.kafka import wait_until
from tests.support.services import Services

OLD, NEW = "2 hours", "0 seconds"


def _rows(conn: psycopg.Connection[Any], ago: str) -> None:
    """One row of each kind written ``ago``: half may be forgotten once old, half never."""
    row = conn.execute("SELECT now() - %s::interval, count(*) FROM inorder_step_log", (ago,))
    at, n = row.fetchone() or (None, 0)
    e = f"e{n}"
    conn.execute(
        "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied, "
        "updated_at) VALUES ('r', %s, 1, 5, %s)",
        (e, at),
    )
    conn.execute(
        "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, "
        "event_type, applied_at) VALUES ('r', %s, 1, 1, 'x', 'r.t', %s)",
        (e, at),
    )
    for seq, completed in ((3, at), (2, None)):  # finished: may go; unfinished: stays
        conn.execute(
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id, "
            "started_at, completed_at) VALUES ('r', %s, 1, %s, 'x', %s, %s)",
            (e, seq, at, completed),
        )
    for seq in (4, 9):  # applied (4 <= 5): may go; not applied yet (9): stays
        conn.execute(
            "INSERT INTO inorder_step_failures (route, entity_id, generation, seq, event_id, "
            "event_type, attempt, error, led_to, failed_at) VALUES ('r', %s, 1, %s, 'x', "
            "'r.t', 1, 'boom', 'retry', %s)",
            (e, seq, at),
        )
    for status, resolved in (("healed", at), ("open", None)):
        conn.execute(
            "INSERT INTO inorder_gaps (route, entity_id, generation, from_seq, to_seq, "
            "event_type, status, first_seen, resolved_at) VALUES ('r', %s, 1, 2, 3, 'r.t', "
            "%s, %s, %s)",
            (f"g{n}{status}", status, at, resolved),
        )
    for status in ("discarded", "new"):
        letter = conn.execute(
            "INSERT INTO inorder_dead_letters (entity_type, entity_id, generation, seq, "
            "event_id, reason, detail, topic, kafka_partition, kafka_offset, recorded_at, "
            "status) VALUES ('r', %s, 1, 1, 'x', 'apply_failed', 'd', 't', 0, 0, %s, %s) "
            "RETURNING id",
            (e, at, status),
        ).fetchone()
        if status == "discarded" and letter is not None:
            conn.execute(
                "INSERT INTO inorder_dead_letter_decisions (letter_id, decision, done_by, "
                "reason, done_at) VALUES (%s, 'discarded', 'ana', 'dup', %s)",
                (letter[0], at),
            )
    for offset, (status, replayed) in enumerate((("replayed", at), ("held", None))):
        conn.execute(
            "INSERT INTO inorder_held_events (route, entity_id, generation, seq, event_id, "
            "held_topic, held_partition, held_offset, held_at, status, replayed_at) VALUES "
            "('r', %s, 1, 1, 'x', 'h', 0, %s, %s, %s, %s)",
            (e, n * 10 + offset, at, status, replayed),
        )


def _counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    found = {}
    for table in (*history.FORGETTABLE, "inorder_step_progress"):
        query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        row = conn.execute(query).fetchone()
        found[table] = int(row[0]) if row else -1
    return found


@pytest.fixture
def conn(pg_schema: PgSchema) -> Any:
    with pg_schema.connect(autocommit=True) as connection:
        tables.migrate(connection)
        yield connection


def test_old_history_goes_and_what_still_matters_stays(conn: psycopg.Connection[Any]) -> None:
    """Old: the log, finished calls, applied failures, resolved gaps, decided letters and
    replayed copies go; open letters and gaps, unfinished calls, progress stay; new: all."""
    _rows(conn, OLD)
    _rows(conn, NEW)
    before = _counts(conn)
    gone = history.forget(conn, 3600, 1000)
    assert gone == dict.fromkeys(history.FORGETTABLE, 1)
    after = _counts(conn)
    assert {t: before[t] - after[t] for t in before} == {
        **dict.fromkeys(history.FORGETTABLE, 1),
        "inorder_step_progress": 0,
    }
    assert history.forget(conn, 3600, 1000) == dict.fromkeys(history.FORGETTABLE, 0)
    left = conn.execute(
        "SELECT status FROM inorder_dead_letters WHERE recorded_at < now() - interval '1 hour'"
    ).fetchall()
    assert left == [("new",)]  # the open letter stays, however old


def _logged(conn: psycopg.Connection[Any], steps: int) -> None:
    """Seqs 1..steps logged 10, 9, 8 ... hours ago: the first the oldest."""
    for n in range(steps):
        conn.execute(
            "INSERT INTO inorder_step_log (route, entity_id, generation, seq, event_id, "
            "event_type, applied_at) VALUES ('r', 'e', 1, %s, 'x', 'r.t', "
            "now() - make_interval(hours => 10 - %s))",
            (n + 1, n),
        )


def test_each_pass_deletes_at_most_its_slice_oldest_first(conn: psycopg.Connection[Any]) -> None:
    """Seven old log rows and a slice of three: three, then three, then one."""
    _logged(conn, 7)
    slices = [history.forget(conn, 3600, 3)["inorder_step_log"] for _ in range(4)]
    assert slices == [3, 3, 1, 0]


def test_the_oldest_go_first(conn: psycopg.Connection[Any]) -> None:
    """A slice takes the oldest rows: the newest old row is the one left."""
    _logged(conn, 3)
    history.forget(conn, 3600, 2)
    assert conn.execute("SELECT seq FROM inorder_step_log").fetchall() == [(3,)]


def test_the_active_sweeper_forgets_old_history_and_counts_it(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """A sweeper with a one-minute retention deletes a step logged two hours ago."""
    p = sw.pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        redis_prefix,
        history_retention_s=60,
        history_interval_s=0.5,
    )
    with pg_schema.connect(autocommit=True) as conn:
        _rows(conn, OLD)
    counted = (
        REGISTRY.get_sample_value("history_rows_deleted_total", {"table": "inorder_step_log"})
        or 0.0
    )
    with ExitStack() as stack:
        sw.start_sweeper(p, stack)
        wait_until(lambda: _log_rows(pg_schema) == 0, timeout_s=30)
    assert (
        REGISTRY.get_sample_value("history_rows_deleted_total", {"table": "inorder_step_log"})
        == counted + 1
    )


def _log_rows(pg_schema: PgSchema) -> int:
    with pg_schema.connect() as conn:
        row = conn.execute("SELECT count(*) FROM inorder_step_log").fetchone()
    return int(row[0]) if row else -1
