"""A Debezium outbox feeding inorder: Debezium's PostgreSQL connector and outbox event router
publish the rows, the consumer projects and parks, a lost event is republished from the
outbox by the republish-only relay at the sweeper's request, and the audit finds it clean."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from outbox_relay.republish_only import RepublishOnly
from schemas import headers
from schemas.runtime.health import Health
from tests.conftest import PgSchema, TopicFactory
from tests.integration import consumer_support as cs
from tests.integration import relay_support as rs
from tests.integration import step_support as ss
from tests.integration import sweeper_support as sw
from tests.support.debezium import (
    Connect,
    documented_settings,
    outbox_config,
    outbox_connector,
)
from tests.support.docs import DEBEZIUM, example
from tests.support.kafka import drain, wait_until
from tests.support.services import Services
from tests.support.threads import serving

pytestmark = pytest.mark.debezium

# The Debezium page's outbox table and settings, as a user copies them.
DEBEZIUM_OUTBOX = example("debezium-outbox-table", DEBEZIUM)
SETTINGS = documented_settings()
TABLE = SETTINGS["INORDER_DEBEZIUM_TABLE"]


def write(db: PgSchema, rows: list[tuple[str, str, str, int, dict]]) -> None:
    """Commit (aggregatetype, aggregateid, type, seq, payload) rows, one transaction each."""
    with db.connect() as conn:
        for stream, entity, event_type, seq, payload in rows:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload, seq) "
                    "VALUES (%s, %s, %s, %s, %s, %s)"
                ).format(sql.Identifier(TABLE)),
                (uuid.uuid4(), stream, entity, event_type, orjson.dumps(payload).decode(), seq),
            )
            conn.commit()


def ledger(seqs: range | list[int], entity: str = "a") -> list[tuple[str, str, str, int, dict]]:
    """Ledger rows of one entity."""
    return [("ledger", entity, "ledger.added", s, {"amount": s}) for s in seqs]


def plans(entity: str, seqs: range) -> list[tuple[str, str, str, int, dict]]:
    """Subscription rows of one entity, full state each."""
    return [
        (
            "subscription",
            entity,
            "subscription.plan_changed",
            s,
            {"plan": cs.PLANS[s % 4], "price_cents": s * 100, "status": "active"},
        )
        for s in seqs
    ]


@pytest.fixture
def fed(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    redis_prefix: str,
    connect: Connect,
    kafka_admin: AdminClient,
) -> Iterator[sw.Pipeline]:
    """The consumer's tables, a Debezium outbox, and a connector routing it to two topics."""
    ledger_topic = topic_factory("ledger")
    prefix = ledger_topic.removesuffix(".ledger")
    subscription_topic = f"{prefix}.subscription"  # the router's topic for that stream
    create_topic(kafka_admin, subscription_topic)
    p = sw.pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        redis_prefix,
        routes_text=ss.routes_text() + cs.ROUTES,
        debezium_topics=[ledger_topic, subscription_topic],
        debezium_topic_replacement=prefix + ".${routedByValue}",
        debezium_placement=SETTINGS["INORDER_DEBEZIUM_PLACEMENT"],
        debezium_table=TABLE,
    )
    cs.create_view(pg_schema)
    with pg_schema.connect(autocommit=True) as conn:
        conn.execute(DEBEZIUM_OUTBOX)
    # Written before the connector starts: Debezium never sends it (a lost event).
    write(pg_schema, ledger([3]))
    name = f"inorder_{uuid.uuid4().hex[:12]}"
    config = outbox_config(
        services.database_url, pg_schema.name, name, p.settings.debezium_topic_replacement
    )
    try:
        with outbox_connector(connect, services.database_url, config):
            yield p
    finally:
        kafka_admin.delete_topics([subscription_topic])[subscription_topic].result(timeout=30)


def create_topic(admin: AdminClient, name: str) -> None:
    """A topic of three partitions, as the router's other topics are."""
    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(
        timeout=30
    )


@contextmanager
def republish_only(p: sw.Pipeline) -> Iterator[RepublishOnly]:
    """The relay's republish-only role on the pipeline's Debezium outbox, in a thread."""
    settings = rs.settings_for(
        p.db,
        p.services.kafka_bootstrap,
        p.topics,
        relay_role=SETTINGS["INORDER_RELAY_ROLE"],
        debezium_table=TABLE,
        debezium_placement=SETTINGS["INORDER_DEBEZIUM_PLACEMENT"],
        debezium_topic_replacement=p.settings.debezium_topic_replacement,
    )
    relay = RepublishOnly(settings, Health())
    with serving("republish-only relay", relay.run, relay.stop):
        yield relay


@contextmanager
def consuming(p: sw.Pipeline) -> Iterator[None]:
    """Consumer, sweeper and the republish-only relay, until the block ends."""
    with ExitStack() as stack:
        stack.enter_context(cs.running(p.consumer))
        stack.enter_context(republish_only(p))
        sw.start_sweeper(p, stack)
        yield


def test_debezium_rows_are_projected_and_stepped_and_a_lost_one_is_republished(
    fed: sw.Pipeline,
) -> None:
    """Steps 1, 2, 4, 5, 6 and two subscriptions through Debezium; 4..6 park behind the lost 3,
    the sweeper asks, the republish-only relay re-sends 3 from the outbox, every step
    applies once in order, the projection holds the newest plan; the audit is clean."""
    db = fed.db
    with consuming(fed):
        write(db, ledger([1, 2, 4, 5, 6]) + plans("s1", range(1, 4)) + plans("s2", range(1, 3)))
        wait_until(lambda: ss.applied(db) == [(1, s) for s in range(1, 7)], timeout_s=90)
        wait_until(lambda: cs.view(db).get("s1", (0, 0))[:2] == (1, 3) and "s2" in cs.view(db))
        wait_until(lambda: [g[0] for g in sw.gap_rows(fed)] == ["healed"], timeout_s=30)
    assert ss.applied(db) == [(1, s) for s in range(1, 7)]
    assert cs.view(db)["s1"] == (1, 3, cs.PLANS[3], 300, "active")
    gaps = sw.gap_rows(fed)
    assert [(g[0], g[1], g[2], g[4]) for g in gaps] == [("healed", 3, 3, "sweeper")]

    done = admin(fed, "--json", "audit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"divergences":0' in done.stdout
    assert '"entities":3' in done.stdout  # ledger:a, subscription:s1 and s2
    story = orjson.loads(admin(fed, "--json", "explain", "ledger:a").stdout)
    assert [(r["seq"], r["sent"]) for r in story["outbox"]] == [(s, True) for s in range(1, 7)]
    assert story["verdict"] == "consistent with the outbox"


def admin(p: sw.Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    """inorder-admin with the pipeline's settings and its Debezium outbox."""
    env = sw.env(p) | {
        "INORDER_DEBEZIUM_TOPICS": orjson.dumps(p.settings.debezium_topics).decode(),
        "INORDER_DEBEZIUM_TOPIC_REPLACEMENT": p.settings.debezium_topic_replacement,
        "INORDER_DEBEZIUM_TABLE": TABLE,
        "INORDER_DEBEZIUM_PLACEMENT": SETTINGS["INORDER_DEBEZIUM_PLACEMENT"],
    }
    return sw.run_tool("inorder-admin", env, *args)


def test_a_debezium_message_that_is_no_event_is_dead_lettered_with_its_reason(
    fed: sw.Pipeline,
) -> None:
    """A row whose seq is no number (the table's column made text) is dead-lettered with the
    reason and where it came from, and the next events apply."""
    db = fed.db
    with db.connect(autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER COLUMN seq TYPE text").format(sql.Identifier(TABLE))
        )
    with consuming(fed):
        write(db, [("ledger", "b", "ledger.added", "x1", {"amount": 1})])  # type: ignore[list-item]
        write(db, ledger([1, 2], entity="c"))
        wait_until(lambda: ss.applied(db, "c") == [(1, 1), (1, 2)], timeout_s=60)
        [letter] = drain(fed.services.kafka_bootstrap, fed.settings.dead_letter_topic, expect=1)
    said = {k: v.decode() for k, v in letter.headers() or [] if v is not None}
    assert said[headers.DLQ_REASON] == "wrong_type"
    assert said[headers.DLQ_DETAIL] == "seq must be a whole number, got 'x1'"
    assert said[headers.DLQ_TOPIC] == fed.settings.debezium_topics[0]
    assert letter.key() == b"b"


def test_held_debezium_events_are_replayed_to_their_own_topic_in_their_own_form(
    fed: sw.Pipeline,
) -> None:
    """Past the park cap, Debezium's messages are held as they came; `held replay` sends them
    back to the router's topic, read there in Debezium's form, and every step applies once."""
    db = fed.db
    fed.settings.routes_file.write_text(ss.routes_text(max_parked=1) + cs.ROUTES)
    with consuming(fed):
        write(db, ledger([1, 2, 4, 5, 6]))  # 3 is the row Debezium never sent
        wait_until(lambda: (ss.progress(db) or (0, 0, False))[2] is True, timeout_s=60)  # held
        wait_until(lambda: ss.progress(db)[1] == 4, timeout_s=90)  # 3 republished, 4 drained
        done = admin(fed, "--json", "held", "replay", "ledger:a", "--by", "ana")
        assert done.returncode == 0, done.stdout + done.stderr
        told = orjson.loads(done.stdout.splitlines()[0])
        assert (told["events"], told["to"]) == (2, fed.settings.debezium_topics[0])
        wait_until(lambda: ss.progress(db)[1] == 6, timeout_s=60)
    assert ss.applied(db) == [(1, s) for s in range(1, 7)]
