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

from schemas.batches import BatchItem, BatchTopics, create_batch
from tests.conftest import PgSchema, TopicFactory
from tests.faults import effects
from tests.faults.conftest import Scale, report
from tests.faults.pipeline import Pipeline
from tests.faults.proxy import FaultProxy
from tests.faults.test_faults import _complete, _mail, _mail_done, start
from tests.integration import consumer_support as cs
from tests.support.services import Services

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(900)]

MEMBERS = tuple(f"consumer-{n}" for n in range(1, 13))
LOCK_MS = 8000


def test_twelve_share_members_killed_and_frozen_stay_correct(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    scale: Scale,
) -> None:
    """12 share members, 3 partitions, every kind; 2 killed, 1 frozen past its lock: all once."""
    work, output = topic_factory("work"), topic_factory("output")
    batch_route = (
        f'[[route]]\nstream = "batch"\nkind = "batch"\noutput_topic = "{output}"\n'
        f'work_topic = "{work}"\n'
    )
    pipeline = Pipeline(
        pg_schema,
        services,
        topic_factory,
        tmp_path,
        # Two lanes each: twelve members' lanes and their calls' connections fit PostgreSQL.
        routes=effects.ROUTES + effects.MAIL_ROUTE.replace("lanes = 16", "lanes = 2") + batch_route,
        partitions=3,
        INORDER_WORK_TOPIC=work,
        INORDER_CONSUMER_MODE="share",
        INORDER_SHARE_RECORD_LOCK_MS=str(LOCK_MS),
        INORDER_SHARE_MAX_POLL_RECORDS="5",
        INORDER_SHARE_LOCK_MARGIN_MS="2000",
        INORDER_KAFKA_EXTRA="{}",
    )
    pipeline.env["INORDER_EVENTS_TOPIC"] = pipeline.events_topic  # where results go
    batches = [f"share-batch-{n:03d}" for n in range(scale.entities)]
    keys = [f"item-{i:02d}" for i in range(1, 11)]
    mailed = [f"m{n:04d}" for n in range(scale.entities * 10)]
    try:
        start(pipeline, "relay-1", "worker-1", *MEMBERS)
        _start_sweeper_without_republish(pipeline, topic_factory)
        started = time.monotonic()
        load = pipeline.load(scale.entities, scale.ops_per_entity, scale.rate, seed=5)
        _create_batches(pipeline, work, batches, keys)
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
        pipeline.wait_for("every batch complete", lambda: _complete(pipeline) == len(batches), 240)
        pipeline.wait_for("every mail step", lambda: _mail_done(pipeline) == len(mailed), 240)
        pipeline.settle(timeout=240)
        with pipeline.db.connect() as conn:
            outputs = conn.execute(
                "SELECT entity_id, payload FROM outbox WHERE event_type = 'batch.assembled'"
            ).fetchall()
            calls = Counter(conn.execute("SELECT entity_id, seq FROM fault_calls").fetchall())
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
        per_batch = Counter(entity for entity, _ in outputs)
        in_order = list(enumerate(keys, start=1))
        wrong = [
            e
            for e, p in outputs
            if [(r["position"], r["item_key"]) for r in p["results"]] != in_order
            or p["complete"] is not True
        ]
        verdict = pipeline.verdict()
        expected_mail = {
            (e, s) for e in mailed for s in (1, 2, 3) if e not in stopped or s < stopped[e]
        }
        twice = sum(n - 1 for n in [*per_batch.values(), *calls.values(), *mail.values()])
        lost = len(batches) - len(per_batch) + len(expected_mail - set(mail))
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
        assert sorted(per_batch) == sorted(batches), "a batch was never assembled"
        assert twice == 0, f"twice: {per_batch.most_common(2)}, {calls.most_common(2)}"
        assert not wrong, f"out of order or incomplete: {wrong[:3]}"
        assert expected_mail <= set(mail), "a mail step was lost"
        # Only a call a kill cut is unknown: that entity stops for a person, at most one
        # per lane of each member killed.
        assert len(stopped) <= 2 * 2, stopped
        assert verdict.clean, f"{verdict}; logs in {pipeline.logs}"
    finally:
        pipeline.close()


def _create_batches(pipeline: Pipeline, work: str, batches: list[str], keys: list[str]) -> None:
    """Each batch created as a producer does, its items going to the worker."""
    where = BatchTopics(topic=pipeline.events_topic, work_topic=work)
    with pipeline.db.connect() as conn:
        for batch_id in batches:
            with conn.transaction():
                create_batch(
                    conn,
                    batch_id,
                    [BatchItem(k, {"k": k}) for k in keys],
                    where=where,
                    deadline_s=600,
                )


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
        routes=effects.ROUTES + effects.MAIL_ROUTE.replace("lanes = 16", "lanes = 2"),
        partitions=3,
        INORDER_CONSUMER_MODE="share",
        INORDER_SHARE_RECORD_LOCK_MS=str(LOCK_MS),
        INORDER_SHARE_MAX_POLL_RECORDS="5",
        INORDER_SHARE_LOCK_MARGIN_MS="2000",
        INORDER_KAFKA_EXTRA="{}",
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
        with pipeline.db.connect() as conn:
            mail = Counter(
                conn.execute(
                    "SELECT entity_id, seq FROM fault_effects WHERE entity_id LIKE 'm%'"
                ).fetchall()
            )
        verdict = pipeline.verdict()
        lost = len({(e, s) for e in mailed for s in (1, 2, 3)} - set(mail))
        twice = sum(n - 1 for n in mail.values())
        report(
            "share group: a member cut off from PostgreSQL past its lock",
            1,
            replace(verdict, lost=verdict.lost + lost, applied_twice=verdict.applied_twice + twice),
            time.monotonic() - started,
        )
        assert (lost, twice) == (0, 0), (lost, twice)
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
