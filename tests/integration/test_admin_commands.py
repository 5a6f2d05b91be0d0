"""inorder-admin's reading commands and manual actions against real services."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import orjson
import redis
from prometheus_client import REGISTRY

from consumer import examples
from schemas import decode, encode
from schemas.republish import decode_request
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import drain, wait_until
from tests.support.services import Services


def _json_lines(text: str) -> list[dict]:
    """The objects printed by --json (rich may indent each one over several lines)."""
    decoder, out, rest = json.JSONDecoder(), [], text.strip()
    while rest:
        obj, end = decoder.raw_decode(rest)
        out.append(obj)
        rest = rest[end:].strip()
    return out


def test_gaps_parked_and_gauges_describe_a_stuck_entity(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Seq 3 never sent, no relay to ask: the gap, the parked events and the gauges show it."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    with cs.running(p.consumer):
        cs.send_events(
            services.kafka_bootstrap, p.topics.events, [ss.step(s) for s in (1, 2, 4, 5)]
        )
        wait_until(lambda: (ss.progress(pg_schema) or (0, 0))[1] == 2)
        with ExitStack() as stack:
            sw.start_sweeper(p, stack)
            wait_until(lambda: [g[0] for g in sw.gap_rows(p)] == ["requested"], timeout_s=30)
            wait_until(lambda: REGISTRY.get_sample_value("events_parked_current") == 2.0)
            wait_until(
                lambda: REGISTRY.get_sample_value("gaps_open", {"status": "requested"}) == 1.0
            )
    [gap] = _json_lines(sw.admin(p, "--json", "gaps", "list").stdout)
    assert (gap["entity"], gap["range"], gap["status"]) == ("a", "3..3", "requested")
    [shown] = _json_lines(sw.admin(p, "--json", "gaps", "show", str(gap["id"])).stdout)
    assert (shown["from_seq"], shown["to_seq"], shown["attempts"]) == (3, 3, 1)
    [top] = _json_lines(sw.admin(p, "--json", "parked", "top").stdout)
    assert (top["stream"], top["entity"], top["parked"]) == ("ledger", "a", 2)
    missing = sw.admin(p, "gaps", "show", "999999")
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "inorder-admin: there is no gap 999999",
    )


def test_manual_republish_request_reaches_the_relay_topic(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """`republish` puts a well-formed request for the range on the request topic."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    done = sw.admin(p, "republish", "ledger:a", "--from", "4", "--to", "9")
    assert done.returncode == 0, done.stderr
    [message] = drain(services.kafka_bootstrap, p.topics.requests, expect=1)
    request = decode_request(message.value())
    assert (request.entity_type, request.entity_id, request.from_seq, request.to_seq) == (
        "ledger",
        "a",
        4,
        9,
    )
    bad = sw.admin(p, "republish", "ledger:a", "--from", "9", "--to", "4")
    assert "is not a range of seqs" in bad.stderr
    unknown = sw.admin(p, "republish", "invoice:a", "--from", "1")
    assert "'invoice' is not routed" in unknown.stderr


def test_republish_heals_a_projection_and_counts_the_older_events_stale(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """A projection that missed its newest event gets it by `republish`; the rest are stale."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    p.settings.routes_file.write_text(ss.routes_text() + examples.PROJECTION_ROUTE)
    cs.create_view(pg_schema)
    with pg_schema.connect() as conn:
        for seq in (1, 2, 3):
            conn.execute(
                "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, event_id, "
                "payload) VALUES (%s, 'subscription', 'x', %s, 'subscription.plan_changed', %s, "
                "%s)",
                (
                    p.topics.events,
                    seq,
                    f"x:1:{seq}",
                    orjson.dumps(
                        {"plan": cs.PLANS[seq], "price_cents": seq, "status": "active"}
                    ).decode(),
                ),
            )
        conn.execute("UPDATE outbox SET xid = '0' WHERE seq = 3")  # lost: behind every cursor
        conn.commit()
    stale = ("events_stale_total", {"event_type": "subscription.plan_changed"})
    with sw.running(p, sweeper=False):
        wait_until(lambda: cs.view(pg_schema).get("x", (0, 0))[1] == 2)
        before = REGISTRY.get_sample_value(*stale) or 0.0
        lost = orjson.loads(sw.admin(p, "--json", "explain", "subscription:x").stdout)
        assert lost["verdict"] == "diverges, unexplained: row at 1/2, newest event 1/3"
        assert (lost["applied"]["seq"], lost["outbox_rows"]) == (2, 3)
        done = sw.admin(p, "--json", "republish", "subscription:x", "--from", "1", "--to", "3")
        assert done.returncode == 0, done.stderr
        wait_until(lambda: cs.view(pg_schema)["x"][:3] == (1, 3, "enterprise"))
        wait_until(lambda: (REGISTRY.get_sample_value(*stale) or 0.0) - before == 2)
    healed = orjson.loads(sw.admin(p, "--json", "explain", "subscription:x").stdout)
    assert healed["verdict"] == "consistent with the outbox"
    [request] = _json_lines(done.stdout)
    assert (request["entity_type"], request["generation"]) == ("subscription", 1)


def test_held_events_are_listed_and_replayed_once_and_only_as_the_consumer_recorded_them(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_client: redis.Redis,
    redis_prefix: str,
) -> None:
    """Held copies go back once each; a message another client put in the held topic never."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    p.settings.routes_file.write_text(ss.routes_text(max_parked=1))
    forged = ss.step(7)
    with cs.running(p.consumer):
        cs.send_events(
            services.kafka_bootstrap, p.topics.events, [ss.step(s) for s in (1, 2, 4, 5, 6)]
        )
        wait_until(lambda: (ss.progress(pg_schema) or (0, 0, False))[2] is True)  # held
        wait_until(lambda: len(_held_rows(pg_schema)) == 2)
        # Another writer of the held topic: same key, a plausible event.
        cs.send(services.kafka_bootstrap, p.settings.held_topic, [(forged.key, encode(forged))])
        [row] = _json_lines(sw.admin(p, "--json", "held", "list").stdout)
        assert (row["entity"], row["last_applied"]) == ("a", 2)
        cs.send_events(services.kafka_bootstrap, p.topics.events, [ss.step(3)])
        wait_until(lambda: ss.progress(pg_schema)[1] == 4)  # 3 came, 4 drained; 5 and 6 held
        done = sw.admin(p, "--json", "held", "replay", "ledger:a", "--by", "ana")
        assert done.returncode == 0, done.stderr
        [told] = _json_lines(done.stdout)
        assert (told["events"], told["by"]) == (2, "ana")
        wait_until(lambda: ss.progress(pg_schema)[1] == 6)
        again = sw.admin(p, "held", "replay", "ledger:a")
        assert (again.returncode, "no held event recorded" in again.stderr) == (1, True)
    sent = drain(services.kafka_bootstrap, p.topics.events, expect=8)
    seqs = sorted(decode(m.value()).seq for m in sent)
    assert seqs == [1, 2, 3, 4, 5, 5, 6, 6]  # 5 and 6 held then replayed; the forged 7 never
    assert [(r[0], r[1]) for r in _held_rows(pg_schema)] == [(5, "replayed"), (6, "replayed")]
    assert {r[2] for r in _held_rows(pg_schema)} == {"ana"}
    assert ss.progress(pg_schema)[2] is False


def _held_rows(db: PgSchema) -> list[tuple[int, str, str | None]]:
    with db.connect() as conn:
        return conn.execute(
            "SELECT seq, status, replayed_by FROM inorder_held_events ORDER BY seq"
        ).fetchall()
