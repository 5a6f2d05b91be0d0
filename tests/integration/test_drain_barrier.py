"""Drains behind the barrier, on real PostgreSQL, Redis and Kafka: a parked event that raises.

The store refusing one row stands for any error one parked event's values cause: a
trigger on the step log refuses the step of one event id (SQLSTATE P0001, an input's).
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from consumer.kinds import Arrivals, apply_guarded
from schemas import Event, encode, headers
from schemas.runtime.redis_client import RedisClient
from tests.conftest import PgSchema, TopicFactory
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.integration.test_steps_store import EXTERNAL
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

REFUSE = """
CREATE FUNCTION refuse_poisoned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.event_id LIKE '%poisoned%' THEN
        RAISE EXCEPTION 'the step log refuses %', NEW.event_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_poisoned BEFORE INSERT ON inorder_step_log
    FOR EACH ROW EXECUTE FUNCTION refuse_poisoned();
"""


def _refusing(schema: PgSchema) -> PgSchema:
    """The schema with its step log refusing poisoned event ids."""
    with schema.connect(autocommit=True) as conn:
        conn.execute(REFUSE)
    return schema


@pytest.fixture
def steps_db(pg_schema: PgSchema) -> PgSchema:
    ss.prepare(pg_schema)
    return _refusing(pg_schema)


def _poisoned(seq: int, entity: str = "a") -> Event:
    """A step whose row the step log refuses."""
    return replace(ss.step(seq, entity), event_id=f"{entity}:poisoned:{seq}")


def test_a_parked_event_raising_in_the_loops_drain_is_refused_not_the_batch(
    steps_db: PgSchema, redis_client: RedisClient, redis_prefix: str
) -> None:
    """The drained event that raises is refused with its parked bytes; the batch and b apply."""
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    early = [ss.step(2), _poisoned(3), ss.step(4), ss.step(2, "b")]
    with steps_db.connect() as conn:
        ss.feed(run, conn, early)
        batch = [ss.step(1), ss.step(1, "b")]
        outcome = apply_guarded(run, conn, batch, Arrivals((e, encode(e)) for e in batch))
    assert [(r.event.event_id, r.reason) for r in outcome.refused] == [
        ("a:poisoned:3", "apply_failed")
    ]
    [refused] = outcome.refused
    assert refused.copy == encode(_poisoned(3))
    assert refused.detail.startswith("RaiseException P0001: the step log refuses")
    assert ss.applied(steps_db) == [(1, 1), (1, 2)]
    assert ss.applied(steps_db, "b") == [(1, 1), (1, 2)]
    assert run.lot.parked_seqs(ss.STREAM, "a") == [4]  # behind the gap the refusal leaves
    # The same step sent again, valid now, applies and lets 4 drain.
    with steps_db.connect() as conn:
        ss.feed(run, conn, [ss.step(3)])
    assert ss.applied(steps_db) == [(1, s) for s in range(1, 5)]
    assert run.lot.parked_seqs(ss.STREAM, "a") == []


def test_a_parked_event_raising_in_the_sweepers_drain_is_dead_lettered_and_it_sweeps_on(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: RedisClient,
    redis_prefix: str,
) -> None:
    """The sweeper's drain meets a parked event that raises: one letter, and it sweeps on."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix, partitions=1)
    steps_db = _refusing(pg_schema)
    run = ss.runner(redis_client, redis_prefix, ss.routes_text())
    with steps_db.connect() as conn:  # parked as the loop parks them ...
        ss.feed(run, conn, [_poisoned(2), ss.step(3)])
        # ... then seq 1 applied and no drain after it (a consumer that died in between)
        conn.execute(
            "UPDATE inorder_step_progress SET last_applied = 1 WHERE route = %s AND entity_id = %s",
            (ss.STREAM, "a"),
        )
        conn.commit()
    sw.write_with_a_lost_row(p, range(1, 4), lost=2)  # seq 2 only comes when asked for
    with (tmp_path / "sweeper.log").open("ab") as sink:
        sweeper = subprocess.Popen(
            [sw.tool("inorder-sweeper")], env=sw.env(p), stdout=sink, stderr=sink
        )
    try:  # no consumer runs yet: only the sweeper's drain can meet the parked event
        [letter] = drain(services.kafka_bootstrap, p.settings.dead_letter_topic, expect=1)
        with sw.running(p, sweeper=False):
            # The sweeper went on: it found the gap the refusal left and asked for seq 2.
            wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=60)
        assert sweeper.poll() is None
    finally:
        sweeper.send_signal(signal.SIGTERM)
        assert sweeper.wait(timeout=60) == 0
    assert dict(letter.headers() or [])[headers.DLQ_REASON] == b"apply_failed"
    assert letter.value() == encode(_poisoned(2))
    assert ss.applied(steps_db) == [(1, 2), (1, 3)]
    assert run.lot.parked_seqs(ss.STREAM, "a") == []


def test_a_parked_event_raising_in_an_admin_drain_is_dead_lettered_and_the_command_ends_well(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: RedisClient,
    redis_prefix: str,
) -> None:
    """A person's review drains a parked event that raises: it is dead-lettered, the rest holds."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    p.settings.routes_file.write_text(ss.routes_text(extra=EXTERNAL))
    steps_db = _refusing(pg_schema)
    run = ss.runner(redis_client, redis_prefix, p.settings.routes_file.read_text())
    with steps_db.connect(autocommit=True) as conn:  # seq 2's call interrupted: a review waits
        ss.feed(run, conn, [ss.step(1)])
        conn.execute(
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
            "VALUES ('ledger', 'a', 1, 2, 'a:1:2')"
        )
        ss.feed(run, conn, [ss.step(2, event_type="ledger.mailed"), _poisoned(3), ss.step(4)])
    done = sw.admin(p, "review", "confirm", "ledger:a", "--by", "ana", "--run-handlers")
    assert (done.returncode, "Traceback" in done.stderr) == (0, False), done.stderr
    [letter] = drain(services.kafka_bootstrap, p.settings.dead_letter_topic, expect=1)
    assert dict(letter.headers() or [])[headers.DLQ_REASON] == b"apply_failed"
    assert letter.value() == encode(_poisoned(3))
    assert ss.progress(steps_db)[1:4] == (2, False, None)
    assert run.lot.parked_seqs(ss.STREAM, "a") == [4]
