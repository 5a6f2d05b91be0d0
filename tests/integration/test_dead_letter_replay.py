"""inorder-admin dead-letters against the real pipeline: listed, replayed once, discarded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import PgSchema, TopicFactory
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

INVOICES = ["inv-1", "inv-2", "inv-3"]
ROUTED = (
    ss.routes_text()
    + '[[route]]\nstream = "invoice"\nkind = "step"\n[route.handlers]\n'
    + '"invoice.sent" = "tests.integration.step_handlers:record"\n'
)


def _write_invoices(p: sw.Pipeline, seqs: range, *, payload_bytes: int = 0) -> None:
    """Outbox rows of the (not yet routed) invoice stream, for every invoice entity."""
    body = orjson.dumps({"note": "x" * payload_bytes}).decode()
    with p.db.connect() as conn:
        for entity in INVOICES:
            for seq in seqs:
                conn.execute(
                    "INSERT INTO outbox (topic, entity_type, entity_id, seq, event_type, "
                    "event_id, payload) VALUES (%s, 'invoice', %s, %s, 'invoice.sent', %s, %s)",
                    (p.topics.events, entity, seq, f"{entity}:1:{seq}", body),
                )
        conn.commit()


def _letters(p: sw.Pipeline) -> list[dict[str, Any]]:
    """Every letter's row: id, entity, seq, reason, status, replays, cut."""
    with p.db.connect() as conn:
        rows = conn.execute(
            "SELECT id, entity_id, seq, reason, status, replays, cut FROM inorder_dead_letters "
            "ORDER BY id"
        ).fetchall()
    keys = ("id", "entity", "seq", "reason", "status", "replays", "cut")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _decisions(p: sw.Pipeline) -> list[tuple[Any, ...]]:
    with p.db.connect() as conn:
        return conn.execute(
            "SELECT letter_id, decision, source, done_by, reason "
            "FROM inorder_dead_letter_decisions ORDER BY letter_id"
        ).fetchall()


def _json(result: Any) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in result.stdout.splitlines()]


def _refused_then_routed(p: sw.Pipeline, **written: int) -> None:
    """The invoices are written while unrouted (dead-lettered), then the stream is routed."""
    _write_invoices(p, range(1, 4), **written)
    with sw.running(p, sweeper=False):
        wait_until(lambda: len(_letters(p)) == 9, timeout_s=60)
    p.settings.routes_file.write_text(ROUTED)


def _all_applied(p: sw.Pipeline) -> bool:
    return all(ss.applied(p.db, e) == [(1, 1), (1, 2), (1, 3)] for e in INVOICES)


def test_after_a_routes_fix_replay_by_reason_applies_every_letter_once(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """unknown_stream letters: a dry run changes nothing; replay applies each once; again: none."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    _refused_then_routed(p)
    assert {(x["reason"], x["status"], x["replays"]) for x in _letters(p)} == {
        ("unknown_stream", "new", 0)
    }
    listed = _json(sw.admin(p, "--json", "dead-letters", "list", "--reason", "unknown_stream"))
    assert sorted((x["entity"], x["seq"]) for x in listed) == [
        (e, s) for e in INVOICES for s in (1, 2, 3)
    ]
    assert listed[0]["event_type"] == "invoice.sent"
    why = ("--why", "invoice routed in release 42")
    dry = sw.admin(
        p, "--json", "dead-letters", "replay", "--reason", "unknown_stream", "--dry-run", *why
    )
    assert dry.returncode == 0, dry.stderr
    assert len(_json(dry)) == 9
    assert {x["status"] for x in _letters(p)} == {"new"}
    with p.db.connect() as conn:  # as a replay that died after taking two letters leaves them
        conn.execute(
            "UPDATE inorder_dead_letters SET status = 'replaying' "
            "WHERE id IN (SELECT id FROM inorder_dead_letters ORDER BY id LIMIT 2)"
        )
        conn.commit()
    with sw.running(p):
        done = sw.admin(p, "--json", "dead-letters", "replay", "--reason", "unknown_stream", *why)
        assert done.returncode == 0, done.stderr
        assert {(x["from"], x["refused"]) for x in _json(done)} == {("copy", None)}
        assert len(_json(done)) == 9  # the two left replaying are finished too
        wait_until(lambda: _all_applied(p), timeout_s=60)
        again = sw.admin(p, "--json", "dead-letters", "replay", "--reason", "unknown_stream", *why)
        assert (again.returncode, again.stdout) == (0, "")
    assert {x["status"] for x in _letters(p)} == {"replayed"}
    assert len(_letters(p)) == 9  # none refused again
    decisions = _decisions(p)
    assert len(decisions) == 9
    assert {d[1:3] for d in decisions} == {("replayed", "copy")}
    assert {d[4] for d in decisions} == {"invoice routed in release 42"}
    story = orjson.loads(sw.admin(p, "--json", "explain", "invoice:inv-1").stdout)
    assert [x["status"] for x in story["dead_letters"]] == ["replayed"] * 3
    assert all("replayed from copy by" in x["decisions"] for x in story["dead_letters"])
    audited = sw.admin(p, "--json", "audit")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    *replays, summary = _json(audited)
    assert (summary["unexplained"], summary["letters_replayed"]) == (0, 9)
    assert {(r["replayed_from"], r["why"]) for r in replays} == {
        ("copy", "invoice routed in release 42")
    }


def test_a_letter_cut_to_size_is_replayed_from_the_outbox(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """A copy cut to size is refused as a copy (exit 1, nothing sent); --from-outbox applies it."""
    p = sw.pipeline(
        pg_schema, services, topic_factory, tmp_path, redis_prefix, dead_letter_max_value_bytes=1024
    )
    _refused_then_routed(p, payload_bytes=3000)
    assert {x["cut"] for x in _letters(p)} == {True}
    why = ("--why", "routed now")
    with sw.running(p):
        copy = sw.admin(p, "--json", "dead-letters", "replay", "--entity", "inv-1", *why)
        assert copy.returncode == 1
        assert {x["refused"] for x in _json(copy)} == {
            "its copy was cut to size: replay it with --from-outbox"
        }
        assert {x["status"] for x in _letters(p)} == {"new"}
        done = sw.admin(p, "--json", "dead-letters", "replay", "--from-outbox", "--all", *why)
        assert done.returncode == 0, done.stderr
        assert {x["from"] for x in _json(done)} == {"outbox"}
        wait_until(lambda: _all_applied(p), timeout_s=60)
    assert {x["status"] for x in _letters(p)} == {"replayed"}
    requests = drain(services.kafka_bootstrap, p.topics.requests, expect=9)
    assert len(requests) == 9


def test_a_letter_refused_again_counts_its_replays_and_stops_looping(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
) -> None:
    """Replayed unfixed, a letter returns with replays 1; at 3 replay refuses; discard ends it."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    _write_invoices(p, range(1, 2))
    why = ("--why", "try again")
    with sw.running(p, sweeper=False):
        wait_until(lambda: len(_letters(p)) == 3, timeout_s=60)
        unnamed = sw.admin(p, "--json", "dead-letters", "replay", *why)
        assert (unnamed.returncode, "or --all for every open letter" in unnamed.stderr) == (1, True)
        assert {x["status"] for x in _letters(p)} == {"new"}
        done = sw.admin(p, "--json", "dead-letters", "replay", "--all", *why)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: len(_letters(p)) == 6, timeout_s=60)
    again = [x for x in _letters(p) if x["status"] == "new"]
    assert {(x["reason"], x["replays"]) for x in again} == {("unknown_stream", 1)}
    with p.db.connect() as conn:
        conn.execute("UPDATE inorder_dead_letters SET replays = 3 WHERE status = 'new'")
        conn.commit()
    looped = sw.admin(p, "--json", "dead-letters", "replay", "--all", *why)
    assert looped.returncode == 1
    assert all("replayed 3 times already" in x["refused"] for x in _json(looped))
    dry = sw.admin(p, "--json", "dead-letters", "discard", "--dry-run", "--why", "no such stream")
    assert len(_json(dry)) == 3
    unnamed = sw.admin(p, "--json", "dead-letters", "discard", "--why", "no such stream")
    assert unnamed.returncode == 1
    gone = sw.admin(
        p, "--json", "dead-letters", "discard", "--all", "--why", "no such stream", "--by", "ops"
    )
    assert gone.returncode == 0, gone.stderr
    assert sorted(x["status"] for x in _letters(p)) == ["discarded"] * 3 + ["replayed"] * 3
    assert sw.admin(p, "--json", "dead-letters", "replay", "--all", *why).stdout == ""
    shown = _json(sw.admin(p, "--json", "dead-letters", "show", str(again[0]["id"])))
    assert shown[0]["status"] == "discarded"
    assert (shown[1]["decision"], shown[1]["done_by"]) == ("discarded", "ops")
    missing = sw.admin(p, "dead-letters", "show", "999999")
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "inorder-admin: there is no dead letter 999999",
    )
    empty = sw.admin(p, "dead-letters", "discard", "--why", " ")
    assert empty.returncode == 1


def test_a_recreated_dead_letter_topic_is_never_replayed_as_letters(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
    kafka_admin: AdminClient,
) -> None:
    """Another client's messages at the letters' places: each letter refused, none sent."""
    p = sw.pipeline(pg_schema, services, topic_factory, tmp_path, redis_prefix)
    _refused_then_routed(p)
    dlq = p.settings.dead_letter_topic
    kafka_admin.delete_topics([dlq], operation_timeout=30)[dlq].result(timeout=30)
    wait_until(lambda: dlq not in kafka_admin.list_topics(timeout=10).topics, timeout_s=60)
    wait_until(lambda: _created(kafka_admin, dlq), timeout_s=60)
    stranger = Producer({"bootstrap.servers": services.kafka_bootstrap})
    for partition in range(3):
        for _ in range(12):
            stranger.produce(dlq, b"{}", b"someone-else", partition=partition)
    assert stranger.flush(30) == 0
    replayed = sw.admin(p, "--json", "dead-letters", "replay", "--all", "--why", "routed now")
    assert replayed.returncode == 1
    assert {x["refused"] for x in _json(replayed)} == {
        "its place in the dead-letter topic holds another message (the topic recreated?): "
        "replay it with --from-outbox"
    }
    assert {x["status"] for x in _letters(p)} == {"new"}
    assert len(drain(services.kafka_bootstrap, p.topics.events, expect=9)) == 9  # none added


def _created(admin: AdminClient, topic: str) -> bool:
    try:
        admin.create_topics([NewTopic(topic, num_partitions=3)])[topic].result(timeout=30)
    except KafkaException as exc:  # made by an earlier try that timed out, or not yet
        return bool(exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS)
    return True
