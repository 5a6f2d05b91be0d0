"""inorder-admin review: a person confirms or retries an external step that was interrupted."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.conftest import PgSchema, TopicFactory
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.integration.test_steps_store import EXTERNAL
from tests.support.kafka import wait_until
from tests.support.services import Services


@pytest.fixture
def stopped(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> sw.Pipeline:
    """Entity a: seq 1 applied, the external call for seq 2 interrupted, seq 3 parked behind it."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    p.settings.routes_file.write_text(ss.routes_text(extra=EXTERNAL))
    run = ss.runner(redis_client, redis_prefix, p.settings.routes_file.read_text())
    with pg_schema.connect(autocommit=True) as conn:
        ss.feed(run, conn, [ss.step(1)])
        conn.execute(
            "INSERT INTO inorder_step_attempts (route, entity_id, generation, seq, event_id) "
            "VALUES ('ledger', 'a', 1, 2, 'a:1:2')"
        )
        ss.feed(run, conn, [ss.step(2, event_type="ledger.mailed"), ss.step(3)])
    assert ss.progress(pg_schema)[1:4] == (1, False, 2)
    listed = sw.admin(p, "--json", "review", "list")
    assert '"stopped_at":2' in listed.stdout
    return p


def test_review_confirm_advances_past_the_step_without_calling_again(
    stopped: sw.Pipeline, pg_schema: PgSchema
) -> None:
    """Confirm: the earlier call took effect, so seq 2 counts as applied and 3 follows."""
    done = sw.admin(stopped, "review", "confirm", "ledger:a", "--by", "ana", "--run-handlers")
    assert done.returncode == 0, done.stderr
    assert ss.progress(pg_schema)[1:4] == (3, False, None)
    assert ss.applied(pg_schema) == [(1, 1), (1, 3)]  # seq 2's function did not run again
    with pg_schema.connect() as conn:
        logged = conn.execute("SELECT seq, event_id FROM inorder_step_log ORDER BY seq").fetchall()
    assert logged == [(1, "a:1:1"), (2, "confirmed-by:ana"), (3, "a:1:3")]


def test_review_retry_runs_the_step_again(stopped: sw.Pipeline, pg_schema: PgSchema) -> None:
    """Retry: the earlier call did not happen, so seq 2's function runs now, then 3."""
    done = sw.admin(stopped, "review", "retry", "ledger:a", "--run-handlers")
    assert done.returncode == 0, done.stderr
    assert ss.progress(pg_schema)[1:4] == (3, False, None)
    assert ss.applied(pg_schema) == [(1, 1), (1, 2), (1, 3)]


@pytest.mark.parametrize("action", ["confirm", "retry"])
def test_a_decision_without_run_handlers_runs_no_handler_here_and_the_sweeper_applies_it(
    stopped: sw.Pipeline, pg_schema: PgSchema, action: str
) -> None:
    """The command records the decision with handlers it cannot even import; the sweeper,
    beside the consumers, drains the entity on its next pass."""
    routes = stopped.settings.routes_file
    good = routes.read_text()
    routes.write_text(good.replace("tests.integration.step_handlers", "no_such_module_here"))
    refused = sw.admin(stopped, "review", action, "ledger:a", "--run-handlers")
    assert refused.returncode != 0  # --run-handlers would import them here, and cannot
    assert "no_such_module_here" in refused.stderr, refused.stderr
    assert ss.progress(pg_schema)[3] == 2  # still stopped: nothing was decided
    done = sw.admin(stopped, "review", action, "ledger:a", "--by", "ana")
    assert done.returncode == 0, done.stderr
    assert "the sweeper applies what is due" in done.stdout
    assert ss.applied(pg_schema) == [(1, 1)]  # nothing ran here
    assert ss.progress(pg_schema)[3] is None  # no longer stopped
    with pg_schema.connect() as conn:
        woken = conn.execute("SELECT entity_id, decision, asked_by FROM inorder_step_wakes")
        decision = "confirmed" if action == "confirm" else "retried"
        assert woken.fetchall() == [("a", decision, "ana")]
    routes.write_text(good)
    with sw.running(stopped):
        wait_until(lambda: ss.progress(pg_schema)[1] == 3, timeout_s=60)
    expected = [(1, 1), (1, 3)] if action == "confirm" else [(1, 1), (1, 2), (1, 3)]
    assert ss.applied(pg_schema) == expected
    with pg_schema.connect() as conn:
        assert conn.execute("SELECT count(*) FROM inorder_step_wakes").fetchone() == (0,)


def test_review_of_an_entity_that_is_not_stopped_is_refused(stopped: sw.Pipeline) -> None:
    """Unknown entities and entities not waiting for a review get a one-line error."""
    unknown = sw.admin(stopped, "review", "confirm", "ledger:nobody")
    assert (unknown.returncode, unknown.stderr.strip()) == (
        1,
        "inorder-admin: ledger:nobody is unknown: no step progress recorded",
    )
    assert sw.admin(stopped, "review", "retry", "ledger:a", "--run-handlers").returncode == 0
    again = sw.admin(stopped, "review", "retry", "ledger:a")
    assert again.stderr.strip() == "inorder-admin: ledger:a is not waiting for a review"
