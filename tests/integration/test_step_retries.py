"""Retries of a failing step through the relay, consumer and sweeper: only that entity waits."""

from __future__ import annotations

import signal
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_handlers
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import drain, wait_until
from tests.support.services import ROOT, Services


def _routes(handler: str, retry: str) -> str:
    """A ledger step route whose handler has the retry table ``retry``."""
    return (
        f'[[route]]\nstream = "{ss.STREAM}"\nkind = "step"\n'
        f'[route.handlers."ledger.added"]\nfunction = "tests.integration.step_handlers:{handler}"\n'
        f'[route.handlers."ledger.added".retry]\n{retry}\n'
    )


def _pipeline(
    db: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp: Path,
    prefix: str,
    handler: str,
    retry: str,
    **kw: Any,
) -> sw.Pipeline:
    """The whole pipeline on one test's names, its step handler with the retry table given."""
    return sw.pipeline(
        db, services, topic_factory, tmp, prefix, routes_text=_routes(handler, retry), **kw
    )


def _failures(schema: PgSchema, entity: str = "a") -> list[dict[str, Any]]:
    """Every failed call of the entity's steps, oldest first, with its wait in seconds."""
    with schema.connect() as conn:
        rows = conn.execute(
            "SELECT seq, attempt, led_to, extract(epoch FROM retry_at - failed_at)::float8, "
            "error FROM inorder_step_failures WHERE entity_id = %s ORDER BY id",
            (entity,),
        ).fetchall()
    keys = ("seq", "attempt", "led_to", "wait_s", "error")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _applied_at(schema: PgSchema, entity: str, seq: int) -> float:
    """When the step log took the entity's seq (seconds since the epoch)."""
    with schema.connect() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM applied_at)::float8 FROM inorder_step_log "
            "WHERE entity_id = %s AND seq = %s",
            (entity, seq),
        ).fetchone()
    assert row is not None
    return float(row[0])


def _retry_times(schema: PgSchema, entity: str) -> list[float]:
    """When each retry of the entity was due (seconds since the epoch), oldest first."""
    with schema.connect() as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM retry_at)::float8 FROM inorder_step_failures "
            "WHERE entity_id = %s AND led_to = 'retry' ORDER BY id",
            (entity,),
        ).fetchall()
    return [float(r[0]) for r in rows]


def _ended(process: subprocess.Popen[bytes]) -> None:
    """Stop a consumer process (if it still runs) and reap it."""
    if process.poll() is None:
        process.terminate()
    process.wait(30)


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_step_failing_twice_is_applied_once_after_two_retries_with_their_delays(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Two timeouts, then success: waits as configured, later events drain, ok-b never waits."""
    step_handlers.FLAKY.clear()
    retry = 'attempts = 3\nbackoff_s = 1.0\nmax_backoff_s = 1.5\non = ["TimeoutError"]'
    # a and ok-b share the partition: only a may wait
    p = _pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        redis_prefix,
        "flaky_at_3",
        retry,
        partitions=1,
    )
    before = _metric("step_retries_total", route="ledger", event_type="ledger.added")
    sw.write_outbox(p, range(1, 7), entity="a")
    sw.write_outbox(p, range(1, 7), entity="ok-b")
    with sw.running(p):
        wait_until(lambda: (ss.progress(pg_schema, "a") or (0, 0))[1] == 6, timeout_s=60)
        wait_until(lambda: (ss.progress(pg_schema, "ok-b") or (0, 0))[1] == 6, timeout_s=30)
    assert step_handlers.FLAKY["a"] == 3
    assert ss.applied(pg_schema, "a") == [(1, s) for s in range(1, 7)]
    assert ss.applied(pg_schema, "ok-b") == [(1, s) for s in range(1, 7)]
    first, second = _failures(pg_schema, "a")
    assert (first["seq"], first["attempt"], first["led_to"]) == (3, 1, "retry")
    assert (second["seq"], second["attempt"], second["led_to"]) == (3, 2, "retry")
    assert 0.5 <= first["wait_s"] <= 1.0  # 1 s, half of it jittered
    assert 0.75 <= second["wait_s"] <= 1.5  # 2 s capped at 1.5 s, half of it jittered
    assert "TimeoutError" in first["error"]
    # Each call came no sooner than its retry was due; b's steps never waited for a's.
    due = _retry_times(pg_schema, "a")
    assert _applied_at(pg_schema, "a", 3) >= due[-1]
    assert _applied_at(pg_schema, "ok-b", 6) < due[0]
    assert ss.progress(pg_schema, "a")[3:] == (None, None)
    after = _metric("step_retries_total", route="ledger", event_type="ledger.added")
    assert after - before == 2
    told = sw.admin(p, "--json", "explain", "ledger:a")
    assert told.returncode == 0, told.stderr
    story = orjson.loads(told.stdout)
    assert [(f["attempt"], f["led_to"]) for f in story["failed_calls"]] == [
        (1, "retry"),
        (2, "retry"),
    ]
    assert story["step_log"] == [{"generation": 1, "applied": "1..6", "retried": "3 (3 calls)"}]


@pytest.mark.parametrize("then", ["stop", "dead_letter", "skip"])
def test_spent_retries_do_what_the_route_says(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
    then: str,
) -> None:
    """After its last call a step stops for a person, goes to the dead letters, or is skipped."""
    step_handlers.FLAKY.clear()
    retry = f'attempts = 2\nbackoff_s = 0.2\nthen = "{then}"'
    p = _pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix, "down_at_3", retry)
    labels = {"route": "ledger", "event_type": "ledger.added", "then": then}
    before = _metric("step_retries_exhausted_total", **labels)
    sw.write_outbox(p, range(1, 6))
    with sw.running(p):
        if then == "stop":
            wait_until(lambda: (ss.progress(pg_schema) or (0,) * 5)[3] == 3, timeout_s=60)
            wait_until(lambda: len(_failures(pg_schema)) == 2, timeout_s=30)
        else:
            wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 5, timeout_s=60)
    assert step_handlers.FLAKY["a"] == 2
    assert [(f["attempt"], f["led_to"]) for f in _failures(pg_schema)] == [(1, "retry"), (2, then)]
    assert _metric("step_retries_exhausted_total", **labels) - before == 1
    with pg_schema.connect() as conn:
        skips = conn.execute(
            "SELECT from_seq, to_seq, skipped_by FROM inorder_step_skips"
        ).fetchall()
        letters = conn.execute("SELECT seq, reason FROM inorder_dead_letters").fetchall()
    audit = sw.admin(p, "--json", "audit")
    if then == "stop":
        assert ss.applied(pg_schema) == [(1, 1), (1, 2)]
        _, _, _, stopped, reason = ss.progress(pg_schema)
        assert (stopped, "after 2 calls" in reason) == (3, True)
        listed = sw.admin(p, "--json", "review", "list")
        assert [orjson.loads(line)["entity"] for line in listed.stdout.splitlines()] == ["a"]
        assert (skips, letters) == ([], [])
        return
    assert ss.applied(pg_schema) == [(1, 1), (1, 2), (1, 4), (1, 5)]
    if then == "skip":
        assert (skips, letters) == ([(3, 3, "retries")], [])
        assert audit.returncode == 0, audit.stdout + audit.stderr
        return
    assert (skips, letters) == ([], [(3, "step_failed")])
    [copy] = drain(services.kafka_bootstrap, p.settings.dead_letter_topic, expect=1)
    assert orjson.loads(copy.value())["seq"] == 3
    found = dict(copy.headers() or [])
    assert found["inorder-dlq-reason"] == b"step_failed"
    assert b"after 2 calls" in found["inorder-dlq-detail"]
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "dead-letter" in audit.stdout


def test_an_exception_not_named_in_on_stops_at_its_first_call(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """A ConnectionError under ``on = ["TimeoutError"]`` is not retried: it does what then says."""
    step_handlers.FLAKY.clear()
    retry = 'attempts = 5\nbackoff_s = 0.2\non = ["TimeoutError"]'
    p = _pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix, "down_at_3", retry)
    sw.write_outbox(p, range(1, 5))
    with sw.running(p):
        wait_until(lambda: (ss.progress(pg_schema) or (0,) * 5)[3] == 3, timeout_s=60)
        wait_until(lambda: ss.applied(pg_schema) == [(1, 1), (1, 2)], timeout_s=30)
    assert step_handlers.FLAKY["a"] == 1
    [failure] = _failures(pg_schema)
    assert (failure["attempt"], failure["led_to"]) == (1, "stop")
    assert "ConnectionError is not retried" in ss.progress(pg_schema)[4]


def test_a_consumer_killed_while_a_retry_waits_loses_nothing(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """SIGKILL during the wait: the timer is in PostgreSQL; a new consumer and sweeper finish."""
    flag = tmp_path / "failing"
    flag.touch()
    retry = "attempts = 20\nbackoff_s = 0.5\nmax_backoff_s = 1.0"
    p = _pipeline(
        pg_schema, services, topic_factory, tmp_path, redis_prefix, "flaky_while_flagged", retry
    )
    env = {**cs.consumer_env(p.consumer), "PYTHONPATH": str(ROOT)}
    env["INORDER_TEST_FAIL_FLAG"] = str(flag)
    sw.write_outbox(p, range(1, 9))
    with ExitStack() as stack:
        stack.enter_context(
            rs.running(rs.settings_for(pg_schema, services.kafka_bootstrap, p.topics))
        )
        first = subprocess.Popen([sw.tool("inorder-consumer")], env=env)
        stack.callback(_ended, first)
        wait_until(lambda: len(_failures(pg_schema)) >= 1, timeout_s=60)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        # No sweeper yet: the entity waits for its retry, not for a person.
        waiting = sw.admin(p, "--json", "review", "retrying")
        assert waiting.returncode == 0, waiting.stderr
        [row] = [orjson.loads(line) for line in waiting.stdout.splitlines()]
        assert (row["entity"], row["seq"], row["failures"]) == ("a", 3, 1)
        assert sw.admin(p, "--json", "review", "list").stdout == ""
        flag.unlink()  # the service is back while no consumer runs
        second = subprocess.Popen([sw.tool("inorder-consumer")], env=env)
        stack.callback(_ended, second)
        sw.start_sweeper(p, stack)
        wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 8, timeout_s=60)
    assert ss.applied(pg_schema) == [(1, s) for s in range(1, 9)]
    assert {f["led_to"] for f in _failures(pg_schema)} == {"retry"}
