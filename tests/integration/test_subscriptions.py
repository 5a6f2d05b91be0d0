"""The example service: versions from the entity row, new generations, the load generator."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import pytest

from producer import EntityExistsError, EntityNotFoundError, loadgen, migrate
from producer import subscriptions as subs
from tests.conftest import PgSchema


@pytest.fixture
def service(pg_schema: PgSchema) -> PgSchema:
    with pg_schema.connect(autocommit=True) as conn:
        migrate.apply(conn, (migrate.OUTBOX, migrate.EXAMPLE))
    return pg_schema


def _outbox(schema: PgSchema, entity_type: str) -> list[tuple[Any, ...]]:
    with schema.connect() as conn:
        return conn.execute(
            "SELECT entity_id, generation, seq, event_type, payload FROM outbox "
            "WHERE entity_type = %s ORDER BY id",
            (entity_type,),
        ).fetchall()


def test_concurrent_plan_changes_get_gap_free_versions_in_commit_order(service: PgSchema) -> None:
    """Eight connections changing one subscription at once get versions 2..N+1, last commit last."""
    with service.connect() as conn:
        subs.create_subscription(conn, "s1", "free")
    plans = ("basic", "pro", "enterprise", "free")
    versions: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def writer(index: int) -> None:
        with service.connect() as conn:
            start.wait()
            for round_ in range(10):
                version = subs.change_plan(conn, "s1", plans[(index + round_) % len(plans)])
                with lock:
                    versions.append(version.seq)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(versions) == list(range(2, 82))
    events = _outbox(service, "subscription")
    assert sorted(e[2] for e in events) == list(range(1, 82))
    with service.connect() as conn:
        row = conn.execute("SELECT plan, version FROM subscriptions WHERE id = 's1'").fetchone()
    newest = max(events, key=lambda e: e[2])
    assert row == (newest[4]["plan"], 81)


def test_add_seats_emits_delta_and_running_total(service: PgSchema) -> None:
    """Each add_seats event carries its own delta and the total after it, in seq order."""
    with service.connect() as conn:
        subs.create_subscription(conn, "s1", "pro", seats=2)
        for count in (3, 1, 4):
            subs.add_seats(conn, "s1", count)
    assert [(e[2], e[3], e[4]) for e in _outbox(service, "seat_ledger")] == [
        (1, "seat_ledger.opened", {"seats": 2}),
        (2, "seat_ledger.seats_added", {"count": 3, "seats": 5}),
        (3, "seat_ledger.seats_added", {"count": 1, "seats": 6}),
        (4, "seat_ledger.seats_added", {"count": 4, "seats": 10}),
    ]


def test_delete_and_recreate_starts_a_new_generation_at_seq_one(service: PgSchema) -> None:
    """A re-created subscription's events have generation 2 and seqs starting again at 1."""
    with service.connect() as conn:
        subs.create_subscription(conn, "s1", "basic")
        subs.change_plan(conn, "s1", "pro")
        subs.delete_subscription(conn, "s1")
        with pytest.raises(EntityNotFoundError):
            subs.change_plan(conn, "s1", "free")
        with pytest.raises(EntityExistsError):
            subs.create_subscription(conn, "s1", "free")
        subs.recreate_subscription(conn, "s1", "free")
        subs.change_plan(conn, "s1", "enterprise")
    assert [(e[1], e[2], e[3]) for e in _outbox(service, "subscription")] == [
        (1, 1, "subscription.created"),
        (1, 2, "subscription.plan_changed"),
        (1, 3, "subscription.deleted"),
        (2, 1, "subscription.created"),
        (2, 2, "subscription.plan_changed"),
    ]


def test_failed_change_writes_no_event(service: PgSchema) -> None:
    """When the state change fails, its event is not written either."""
    with service.connect() as conn:
        subs.create_subscription(conn, "s1", "basic")
        with pytest.raises(KeyError):
            subs.change_plan(conn, "s1", "platinum")
    assert len(_outbox(service, "subscription")) == 1


def test_loadgen_writes_gap_free_versions_per_entity_and_generation(service: PgSchema) -> None:
    """Concurrent load leaves every (entity, generation) with seqs exactly 1..n."""
    plan = loadgen.LoadPlan(entities=20, ops_per_entity=15, writers=6, seed=7, cycle_share=0.1)
    report = loadgen.run(service.conninfo, plan, "inorder.events")
    seqs: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    total = 0
    for entity_type in (subs.SUBSCRIPTION, subs.SEAT_LEDGER):
        for entity_id, generation, seq, _, _ in _outbox(service, entity_type):
            seqs[(entity_type, entity_id, generation)].append(seq)
            total += 1
    assert total == report.events
    assert report.operations == 20 * 15
    for got in seqs.values():
        assert sorted(got) == list(range(1, len(got) + 1))
    assert any(key[2] > 1 for key in seqs)
