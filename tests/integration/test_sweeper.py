"""The sweeper with the real relay, consumer and services: lost events repaired, or handed over."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import orjson
import redis
from prometheus_client import REGISTRY

from schemas.republish import RepublishResult, decode_request, encode
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


def _escalations() -> float:
    return (
        REGISTRY.get_sample_value("event_gaps_escalated_total", {"event_type": "ledger.added"})
        or 0.0
    )


def test_lost_event_is_detected_republished_and_healed(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """A row the relay's cursor passes unsent: later events park, the gap heals by itself."""
    # Gauges on their timer only once an hour: gaps_open must follow the gap by itself.
    p = sw.pipeline(
        pg_schema, services, topic_factory, tmp_path, redis_prefix, gauge_interval_s=3600
    )
    sw.write_with_a_lost_row(p, range(1, 6), lost=3)
    before = _escalations()
    with sw.running(p):
        wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 5, timeout_s=60)
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=30)
        wait_until(lambda: REGISTRY.get_sample_value("gaps_open", {"status": "healed"}) == 1)
    [(status, first, last, attempts, by, _)] = sw.gap_rows(p)
    assert (status, first, last, by) == ("healed", 3, 3, "sweeper")
    assert attempts >= 1
    assert _escalations() - before == 1
    assert ss.applied(pg_schema) == [(1, s) for s in range(1, 6)]
    told = sw.admin(p, "--json", "explain", "ledger:a")
    assert told.returncode == 0, told.stderr
    story = orjson.loads(told.stdout)
    assert story["verdict"] == "consistent with the outbox"
    assert [(r["seq"], r["sent"]) for r in story["outbox"]] == [(s, True) for s in range(1, 6)]
    assert story["step_log"] == [{"generation": 1, "applied": "1..5"}]
    [gap] = story["gaps"]
    assert (gap["status"], gap["range"], gap["resolved_by"]) == ("healed", "1/3..3", "sweeper")
    assert gap["requests"] >= 1
    table = sw.admin(p, "explain", "ledger:a").stdout
    assert table.startswith("# ledger:a (step route)\n")
    assert "# gaps\n" in table
    unknown = sw.admin(p, "explain", "ledger:nobody")
    assert (unknown.returncode, unknown.stderr.strip()) == (
        1,
        "inorder-admin: ledger:nobody: nothing known, in the outbox or in the consumer",
    )


def test_purged_row_makes_the_gap_unrecoverable_until_a_person_skips_it(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """The relay no longer has seq 3: the entity is held; `inorder-admin skip` releases it."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    sw.write_outbox(p, range(1, 6))
    with pg_schema.connect() as conn:
        conn.execute("DELETE FROM outbox WHERE seq = 3")  # purged before anyone asked
        conn.commit()
    with sw.running(p):
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["unrecoverable"], timeout_s=60)
        assert ss.progress(pg_schema)[1:3] == (2, True)
        assert (
            "no open gap"
            in sw.admin(p, "skip", "ledger:zz", "--through", "3", "--reason", "x").stderr
        )
        wrong = sw.admin(p, "skip", "ledger:a", "--through", "7", "--reason", "lost upstream")
        assert (wrong.returncode, "outside ledger:a's open gap 3..3" in wrong.stderr) == (1, True)
        empty = sw.admin(p, "skip", "ledger:a", "--through", "3", "--reason", " ")
        assert "--reason must say why" in empty.stderr
        done = sw.admin(
            p, "skip", "ledger:a", "--through", "3", "--reason", "lost upstream", "--by", "ana"
        )
        assert done.returncode == 0, done.stderr
        wait_until(lambda: ss.progress(pg_schema)[1] == 5)
    [(status, first, last, _, by, reason)] = sw.gap_rows(p)
    assert (status, first, last, by, reason) == ("skipped", 3, 3, "ana", "lost upstream")
    assert ss.applied(pg_schema) == [(1, 1), (1, 2), (1, 4), (1, 5)]
    with pg_schema.connect() as conn:
        skips = conn.execute(
            "SELECT from_seq, to_seq, skipped_by FROM inorder_step_skips"
        ).fetchall()
    assert skips == [(3, 3, "ana")]
    assert ss.progress(pg_schema)[2] is False


def test_standby_sweeper_takes_over_when_the_active_one_dies(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
    redis_client: redis.Redis,
) -> None:
    """kill -9 of the lease holder: the standby takes the lease and the gap still heals."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    lease = f"{p.settings.redis_key_prefix}:sweeper:lease"
    logs = tmp_path / "sweepers.log"
    with logs.open("ab") as sink:
        first = subprocess.Popen(
            [sw.tool("inorder-sweeper")], env=sw.env(p), stdout=sink, stderr=sink
        )
        wait_until(
            lambda: (redis_client.get(lease) or b"").split(b":")[1:2] == [str(first.pid).encode()]
        )
        second = subprocess.Popen(
            [sw.tool("inorder-sweeper")], env=sw.env(p), stdout=sink, stderr=sink
        )
    try:
        time.sleep(1.0)
        first.kill()
        first.wait(timeout=30)
        sw.write_with_a_lost_row(p, range(1, 6), lost=3)
        with sw.running(p, sweeper=False):
            wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["healed"], timeout_s=60)
        holder = redis_client.get(lease) or b""
        assert holder.split(b":")[1] == str(second.pid).encode()
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    assert ss.applied(pg_schema) == [(1, s) for s in range(1, 6)]


def test_unanswered_requests_back_off_then_hand_the_gap_to_a_person(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """With no relay answering, requests repeat after a wait, then the gap is unrecoverable."""
    p = sw.pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        redis_prefix,
        republish_backoff_base_s=0.5,
        republish_max_attempts=2,
    )
    with cs.running(p.consumer), ExitStack() as stack:
        cs.send_events(services.kafka_bootstrap, p.topics.events, [ss.step(s) for s in (1, 2, 4)])
        sw.start_sweeper(p, stack)
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["unrecoverable"], timeout_s=30)
    [(_, first, last, attempts, by, reason)] = sw.gap_rows(p)
    assert (first, last, attempts, by) == (3, 3, 2, "sweeper")
    assert reason == "no repair after 2 republish requests"
    sent = drain(services.kafka_bootstrap, p.topics.requests, expect=2)
    assert len(sent) == 2
    assert sent[1].timestamp()[1] - sent[0].timestamp()[1] >= 400  # waited ~0.5 s before repeating
    assert ss.progress(pg_schema)[2] is True


def test_sweeper_started_without_postgres_waits_unready_instead_of_exiting(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """PostgreSQL unreachable at start-up: the sweeper stays up, unready, and stops cleanly."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    port = rs.free_port()
    dead = f"postgresql://inorder@127.0.0.1:{rs.free_port()}/inorder"
    env = {**sw.env(p), "DATABASE_URL": dead, "INORDER_HTTP_PORT": str(port)}
    log = tmp_path / "sweeper.log"
    with log.open("ab") as sink:
        process = subprocess.Popen([sw.tool("inorder-sweeper")], env=env, stdout=sink, stderr=sink)
    try:

        def readyz() -> tuple[int, str] | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                    return (200, "")
            except urllib.error.HTTPError as exc:
                return (exc.code, exc.read().decode())
            except OSError:
                return None

        status, body = wait_until(readyz)
        assert status == 503
        assert "postgres:" in body
        wait_until(lambda: "postgres_unavailable" in log.read_text(), timeout_s=15)
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
    assert code == 0, log.read_text()


def _unmatched() -> float:
    return REGISTRY.get_sample_value("republish_results_total", {"outcome": "unmatched"}) or 0.0


def test_forged_results_that_answer_no_open_request_are_counted_and_ignored(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Results naming no request the gap sent, or another generation, change nothing."""
    p = sw.pipeline(
        pg_schema, services, topic_factory, tmp_path, redis_prefix, republish_backoff_base_s=600
    )
    before = _unmatched()
    with cs.running(p.consumer), ExitStack() as stack:
        cs.send_events(services.kafka_bootstrap, p.topics.events, [ss.step(s) for s in (1, 2, 4)])
        sw.start_sweeper(p, stack)
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["requested"], timeout_s=30)
        [sent] = drain(services.kafka_bootstrap, p.topics.requests, expect=1)
        asked = decode_request(sent.value())

        def forged(request_id: str, generation: int) -> bytes:
            return encode(
                RepublishResult(request_id, "ledger", "a", generation, 3, 3, (), (3,), (), False)
            )

        guessed = f"gap-{asked.request_id.split('-')[1]}-1-{'0' * 32}"
        cs.send(
            services.kafka_bootstrap,
            p.topics.results,
            [
                (asked.key, forged("made-up", 1)),
                (asked.key, forged(guessed, 1)),
                (asked.key, forged(asked.request_id, 2)),
            ],
        )
        wait_until(lambda: _unmatched() - before == 3, timeout_s=30)
        assert [g[0] for g in sw.gap_rows(p)] == ["requested"]
        assert ss.progress(pg_schema)[2] is False  # not held
        # The answer to the request the gap sent is acted on.
        cs.send(
            services.kafka_bootstrap, p.topics.results, [(asked.key, forged(asked.request_id, 1))]
        )
        wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["unrecoverable"], timeout_s=30)
    assert _unmatched() - before == 3
