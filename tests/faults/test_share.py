"""Twelve consumers in a share group on three partitions, killed and frozen: still correct.

A share group hands one entity's events to many members at the same moment, with no
order at all. The proof runs every route kind at once (projections, steps, steps that
call out, batches), kills two members with SIGKILL and freezes a third past its
acquisition lock, each while it takes records, then judges as the fault suite does:
every projection at its newest version, every step once and in order, every call made
once, every batch assembled once, the audit clean. The sweeper drains what a killed
member left parked, but its republish requests go to a topic no relay reads: a record
a member lost would stay lost, so the judge sees the source itself.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from schemas import headers
from tests.conftest import PgSchema, TopicFactory
from tests.faults import batches as fault_batches
from tests.faults import effects
from tests.faults.conftest import Scale, report
from tests.faults.pipeline import Pipeline
from tests.faults.proxy import FaultProxy
from tests.faults.test_faults import _mail, _mail_done, start
from tests.integration import consumer_support as cs
from tests.support.group_protocol import group_configs
from tests.support.kafka import drain
from tests.support.services import Services

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(900)]

MEMBERS = tuple(f"consumer-{n}" for n in range(1, 13))
LOCK_MS = 8000
# Share mode with a short lock, so the faults outlast it within the test.
SHARE = {
    "INORDER_CONSUMER_MODE": "share",
    "INORDER_SHARE_RECORD_LOCK_MS": str(LOCK_MS),
    "INORDER_SHARE_MAX_POLL_RECORDS": "5",
    "INORDER_SHARE_LOCK_MARGIN_MS": "2000",
    "INORDER_KAFKA_EXTRA": "{}",
}
# Two lanes each: twelve members' lanes and their calls' connections fit PostgreSQL.
MAIL_ROUTE = effects.MAIL_ROUTE.replace("lanes = 16", "lanes = 2")


def test_twelve_share_members_killed_and_frozen_stay_correct(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    scale: Scale,
) -> None:
    """12 share members, 3 partitions, every kind; 2 killed, 1 frozen past its lock: all once."""
    work, output = topic_factory("work"), topic_factory("output")
    pipeline = Pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        routes=effects.ROUTES + MAIL_ROUTE + fault_batches.route(work, output),
        partitions=3,
        INORDER_WORK_TOPIC=work,
        **SHARE,
    )
    pipeline.env["INORDER_EVENTS_TOPIC"] = pipeline.events_topic  # where results go
    batches = [f"share-batch-{n:03d}" for n in range(scale.entities)]
    mailed = [f"m{n:04d}" for n in range(scale.entities * 10)]
    try:
        start(pipeline, "relay-1", "worker-1", *MEMBERS)
        _start_sweeper_without_republish(pipeline, topic_factory)
        started = time.monotonic()
        load = pipeline.load(scale.entities, scale.ops_per_entity, scale.rate, seed=5)
        fault_batches.create(pipeline, work, batches)
        pipeline.wait_for("load under way", lambda: load.written > scale.entities * 2)
        # Mail steps out of order and twice, straight to the topic, in small batches so
        # that every member takes some.
        steps = [_mail(e, seq) for e in mailed for seq in (3, 1, 2, 2)]
        for at in range(0, len(steps), 8):
            cs.send_events(services.kafka_bootstrap, pipeline.events_topic, steps[at : at + 8])
        # The faults land on the members taking the most records (the broker hands
        # records out by produced batch, so some members may take none).
        pipeline.wait_for("three members taking records", lambda: len(_busiest(pipeline)) >= 3)
        first, frozen, second = _busiest(pipeline)[:3]
        pipeline.kill(first)
        pipeline.pause(frozen)  # frozen: its records' lock runs out
        pipeline.kill(second)
        time.sleep(LOCK_MS / 1000 + 3)
        pipeline.resume(frozen)
        load.join()
        pipeline.wait_for(
            "every batch complete", lambda: fault_batches.complete(pipeline) == len(batches), 240
        )
        pipeline.wait_for("every mail step", lambda: _mail_done(pipeline) == len(mailed), 240)
        pipeline.settle(timeout=240)
        found = fault_batches.assembled(pipeline)
        with pipeline.db.connect() as conn:
            calls = Counter(conn.execute("SELECT entity_id, seq FROM fault_calls").fetchall())
        mail, stopped = _mail_applied(pipeline)
        verdict = pipeline.verdict()
        expected_mail = {
            (e, s) for e in mailed for s in (1, 2, 3) if e not in stopped or s < stopped[e]
        }
        twice = found.twice + sum(n - 1 for n in [*calls.values(), *mail.values()])
        lost = found.missing(batches) + len(expected_mail - set(mail))
        report(
            "share group: 12 members, 2 killed, 1 frozen past its lock",
            3,
            replace(
                verdict,
                lost=verdict.lost + lost,
                applied_twice=verdict.applied_twice + twice,
            ),
            time.monotonic() - started,
        )
        assert found.missing(batches) == 0, "a batch was never assembled"
        assert twice == 0, f"twice: {found.per_batch.most_common(2)}, {calls.most_common(2)}"
        assert not found.wrong, f"out of order or incomplete: {found.wrong[:3]}"
        assert expected_mail <= set(mail), "a mail step was lost"
        # Only a call a kill cut is unknown: that entity stops for a person, at most one
        # per lane of each member killed.
        assert len(stopped) <= 2 * 2, stopped
        assert verdict.clean, f"{verdict}; logs in {pipeline.logs}"
    finally:
        pipeline.close()


def _busiest(pipeline: Pipeline) -> list[str]:
    """The members that have acquired records, the most first."""
    taken = {name: pipeline.metric(name, "share_records_acquired_total") for name in MEMBERS}
    return sorted((n for n, count in taken.items() if count > 0), key=lambda n: -taken[n])


def test_a_member_cut_off_from_postgres_hands_its_records_back(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    scale: Scale,
) -> None:
    """A member whose PostgreSQL stays away past the lock releases what it holds: all once."""
    pipeline = Pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        routes=effects.ROUTES + MAIL_ROUTE,
        partitions=3,
        **SHARE,
    )
    proxy = FaultProxy(pipeline.db.url)
    mailed = [f"m{n:04d}" for n in range(scale.entities * 20)]
    try:
        start(pipeline, "relay-1", "consumer-2", "consumer-3")
        pipeline.start("consumer-1", env={"DATABASE_URL": proxy.address(pipeline.db.url)})
        pipeline.wait_for("consumer-1 ready", lambda: pipeline.ready("consumer-1"))
        started = time.monotonic()
        load = pipeline.load(scale.entities, scale.ops_per_entity, scale.rate, seed=6)
        pipeline.wait_for("load under way", lambda: load.written > scale.entities * 2)
        steps = [_mail(e, seq) for e in mailed for seq in (3, 1, 2, 2)]
        for at in range(0, len(steps), 8):  # small produced batches reach every member
            cs.send_events(services.kafka_bootstrap, pipeline.events_topic, steps[at : at + 8])
        # Cut while its lanes call out: what it holds cannot be applied until healed.
        pipeline.wait_for(
            "consumer-1 calling out",
            lambda: pipeline.metric("consumer-1", "steps_lane_events") > 0,
            timeout=60,
        )
        proxy.cut()
        pipeline.wait_for(
            "consumer-1 handing records back",
            lambda: _released(pipeline, "consumer-1") > 0,
            timeout=LOCK_MS / 1000 + 30,
        )
        proxy.heal()
        load.join()
        pipeline.wait_for("every mail step", lambda: _mail_done(pipeline) == len(mailed), 240)
        pipeline.settle(timeout=240)
        mail, stopped = _mail_applied(pipeline)
        verdict = pipeline.verdict()
        expected = {(e, s) for e in mailed for s in (1, 2, 3) if e not in stopped or s < stopped[e]}
        lost = len(expected - set(mail))
        twice = sum(n - 1 for n in mail.values())
        report(
            "share group: a member cut off from PostgreSQL past its lock",
            1,
            replace(verdict, lost=verdict.lost + lost, applied_twice=verdict.applied_twice + twice),
            time.monotonic() - started,
        )
        assert (lost, twice) == (0, 0), (lost, twice)
        # A call the cut caught in flight is unknown: that entity stops for a person, at
        # most one per lane.
        assert len(stopped) <= 2, stopped
        assert verdict.clean, f"{verdict}; logs in {pipeline.logs}"
    finally:
        proxy.close()
        pipeline.close()


def _released(pipeline: Pipeline, name: str) -> float:
    """Records the member handed back because a dependency stayed down."""
    return sum(
        value
        for labels, value in pipeline.samples((name,), "share_records_released_total")
        if labels.get("why") == "outage"
    )


def _start_sweeper_without_republish(pipeline: Pipeline, topic_factory: TopicFactory) -> None:
    """The sweeper, its republish requests sent where no relay reads them."""
    nowhere = topic_factory("nowhere")
    pipeline.start("sweeper-1", env={"INORDER_REPUBLISH_REQUESTS_TOPIC": nowhere})
    pipeline.wait_for("sweeper-1 up", lambda: pipeline.http("sweeper-1", "/healthz")[0] == 200)


def test_a_record_on_its_last_delivery_is_dead_lettered_not_archived(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    """Two deliveries allowed, a step whose database stays away: lettered, never archived."""
    down = (
        '[[route]]\nstream = "mail"\nkind = "step"\n[route.handlers]\n'
        '"mail.sent" = "tests.faults.effects:always_down"\n'
    )
    pipeline = Pipeline(
        pg_schema, services, topic_factory, tmp_path, routes=down, partitions=3, **SHARE
    )
    group_configs(services.kafka_bootstrap, pipeline.group, {"share.delivery.count.limit": "2"})
    try:
        start(pipeline, "consumer-1")
        cs.send_events(services.kafka_bootstrap, pipeline.events_topic, [_mail("d1", 1)])
        # Handed back as its first lock runs out, taken again on its last delivery, and
        # lettered before that lock runs out too.
        pipeline.wait_for(
            "the letter recorded",
            lambda: (
                pipeline.count(
                    "SELECT count(*) FROM inorder_dead_letters WHERE reason = 'delivery_limit'"
                )
                == 1
            ),
            timeout=3 * LOCK_MS / 1000 + 30,
        )
        letters = drain(services.kafka_bootstrap, pipeline.env["INORDER_DEAD_LETTER_TOPIC"])
        assert [dict(m.headers() or [])[headers.DLQ_REASON] for m in letters] == [b"delivery_limit"]
        acquired = pipeline.samples(("consumer-1",), "share_records_acquired_total")
        taken = {labels["delivery"]: value for labels, value in acquired}
        assert (taken.get("first"), taken.get("last")) == (1, 1)
        assert pipeline.metric("consumer-1", "share_records_unlettered_total") == 0
    finally:
        pipeline.close()


def _mail_applied(pipeline: Pipeline) -> tuple[Counter[tuple[str, int]], dict[str, int]]:
    """Each mail step applied (how often), and the entities stopped for a person (at which seq)."""
    with pipeline.db.connect() as conn:
        mail = Counter(
            conn.execute(
                "SELECT entity_id, seq FROM fault_effects WHERE entity_id LIKE 'm%'"
            ).fetchall()
        )
        stopped = dict(
            conn.execute(
                "SELECT entity_id, stopped_at_seq FROM inorder_step_progress "
                "WHERE route = 'mail' AND stopped_at_seq IS NOT NULL"
            ).fetchall()
        )
    return mail, stopped
