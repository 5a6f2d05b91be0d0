"""Batch reassembly through real Kafka and PostgreSQL: the seed's acceptance tests and example."""

from __future__ import annotations

import os
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

import schemas
from consumer.kinds.batches.runner import BatchApplier
from schemas import headers
from tests.conftest import PgSchema, TopicFactory
from tests.integration import batch_support as bs
from tests.integration import consumer_support as cs
from tests.integration.sweeper_support import run_tool
from tests.support.kafka import drain, wait_until
from tests.support.services import Services

LETTERS = [(p, k) for p, k in enumerate(bs.KEYS, start=1)]


@pytest.fixture
def batch(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> bs.BatchSetup:
    return bs.setup(pg_schema, services, topic_factory, tmp_path)


def _finished(db: PgSchema, batch_id: str, wanted: str = "complete") -> bool:
    found = bs.status(db, batch_id)
    return found is not None and found[0] == wanted


def test_shuffled_completion_orders_always_assemble_by_position(batch: bs.BatchSetup) -> None:
    """Whatever order the five results finish in, the output lists A..E by position."""
    orders = [[3, 1, 5, 2, 4], [5, 4, 3, 2, 1], [1, 2, 3, 4, 5], [2, 5, 1, 4, 3]]
    orders += [random.Random(seed).sample(range(1, 6), 5) for seed in range(4)]
    ids = [bs.new_id() for _ in orders]
    with cs.running(batch.settings):
        batch.send([bs.accepted(b) for b in ids])
        for batch_id, order in zip(ids, orders, strict=True):
            batch.send([bs.result(batch_id, p) for p in order])
        wait_until(lambda: all(_finished(batch.db, b) for b in ids), timeout_s=60)
    for batch_id in ids:
        [output] = bs.outputs(batch.db, batch_id)
        assert output["complete"] is True
        assert output["revision"] == 1
        assert bs.positions(output) == LETTERS
        assert output["missing_positions"] == []


def _samples(stream: str) -> tuple[float, float]:
    applied = REGISTRY.get_sample_value("events_applied_total", {"route": stream}) or 0.0
    latency = REGISTRY.get_sample_value("event_apply_latency_seconds_count") or 0.0
    return applied, latency


def test_batch_events_are_counted_applied_with_their_latency(batch: bs.BatchSetup) -> None:
    """A manifest and its results count in events_applied_total and the apply latency."""
    batch_id = bs.new_id()
    applied_before, latency_before = _samples(batch.route.stream)
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send([bs.result(batch_id, p) for p in range(1, 6)])
        wait_until(lambda: _finished(batch.db, batch_id))
    applied, latency = _samples(batch.route.stream)
    assert applied - applied_before == 6
    assert latency > latency_before


def test_a_consumer_with_batch_routes_says_when_no_relay_publishes_its_outbox(
    batch: bs.BatchSetup,
) -> None:
    """Start-up warns once while no relay holds the outbox's slices, and not once one does."""

    def warned() -> list[dict[str, object]]:
        with capture_logs() as logs, cs.running(batch.settings) as service:
            wait_until(lambda: "starting" not in service.health.problems)
        return [entry for entry in logs if entry["event"] == "outbox_relay_not_seen"]

    [warning] = warned()
    assert "run inorder-relay" in str(warning["hint"])
    with batch.db.connect() as conn:  # a relay holds the slices now
        conn.execute(
            "UPDATE outbox_relay_slices SET owner = 'relay-a', "
            "lease_until = now() + interval '1 minute'"
        )
        conn.commit()
    assert warned() == []


def test_earlier_finished_at_for_a_later_position_does_not_reorder(batch: bs.BatchSetup) -> None:
    """Position 5 reporting the earliest finish time still comes fifth."""
    batch_id = bs.new_id()
    stamps = {1: "10:00:05", 2: "10:00:04", 3: "10:00:03", 4: "10:00:02", 5: "09:00:00"}
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send(
            [
                bs.result(batch_id, p, finished_at=f"2026-11-30T{stamps[p]}Z")
                for p in (5, 2, 1, 4, 3)
            ]
        )
        wait_until(lambda: _finished(batch.db, batch_id))
    [output] = bs.outputs(batch.db, batch_id)
    assert bs.positions(output) == LETTERS


def test_one_failure_is_incomplete_with_the_exact_missing_position(batch: bs.BatchSetup) -> None:
    """C fails: the output is incomplete, lists 3 missing, and keeps D at 4 and E at 5."""
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send([bs.result(batch_id, 5), bs.result(batch_id, 3, ok=False)])
        batch.send([bs.result(batch_id, p) for p in (2, 4, 1)])
        wait_until(lambda: _finished(batch.db, batch_id, "incomplete"))
    [output] = bs.outputs(batch.db, batch_id)
    assert output["complete"] is False
    assert output["missing_positions"] == [3]
    assert bs.positions(output) == [(1, "A"), (2, "B"), (4, "D"), (5, "E")]
    assert "failed: 3" in output["reason"]


def test_the_same_result_twice_is_ignored(batch: bs.BatchSetup) -> None:
    """A repeated result, before and after assembly, changes neither the rows nor the output."""
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send([bs.result(batch_id, 2), bs.result(batch_id, 2), bs.result(batch_id, 1)])
        batch.send([bs.result(batch_id, p) for p in (3, 4, 5)])
        wait_until(lambda: _finished(batch.db, batch_id))
        before = bs.outputs(batch.db, batch_id)
        batch.send([bs.result(batch_id, 4), bs.result(batch_id, 2)])
        time.sleep(1.5)
    assert bs.outputs(batch.db, batch_id) == before
    assert len(before) == 1
    assert bs.positions(before[0]) == LETTERS
    assert bs.status(batch.db, batch_id) == ("complete", None, 1)


def test_inconsistent_results_stop_the_batch(batch: bs.BatchSetup) -> None:
    """A mismatched item key, a position above expected_count, a duplicated position: flagged."""
    mismatched, above, twice, bad_manifest = (bs.new_id() for _ in range(4))
    dup_positions = bs.accepted(bad_manifest)
    items = [*dup_positions.payload["items"], {"position": 2, "item_key": "Z"}]
    dup_positions = bs.as_event(
        bs.OutboxEvent(
            "batch", bad_manifest, 1, "batch.accepted", {"expected_count": 6, "items": items}
        )
    )
    with cs.running(batch.settings):
        batch.send([bs.accepted(b) for b in (mismatched, above, twice)] + [dup_positions])
        batch.send(
            [bs.result(mismatched, 2, "Z")] + [bs.result(mismatched, p) for p in (1, 3, 4, 5)]
        )
        batch.send([bs.result(above, p) for p in (1, 2, 3, 4)] + [bs.result(above, 6, "F")])
        batch.send([bs.result(twice, 1), bs.result(twice, 1, attempt=1, ok=True, finished_at="x")])
        batch.send([bs.result(twice, 2, "B")])
        wait_until(
            lambda: all(
                _finished(batch.db, b, "inconsistent") for b in (mismatched, above, bad_manifest)
            )
        )
    assert "item_key 'Z'" in _reason(batch.db, mismatched)
    assert "above expected_count 5" in _reason(batch.db, above)
    assert "duplicate positions" in _reason(batch.db, bad_manifest)
    for batch_id in (mismatched, above, bad_manifest):
        assert bs.outputs(batch.db, batch_id) == []


def test_a_second_different_result_for_a_done_position_is_inconsistent(
    batch: bs.BatchSetup,
) -> None:
    """Position 1 done with r/A, then another success with a different result: flagged."""
    batch_id = bs.new_id()
    first = bs.result(batch_id, 1)
    other = replace(first, event_id="other", payload={**first.payload, "result_ref": "r/other"})
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id), bs.result(batch_id, 1)])
        wait_until(lambda: bs.states(batch.db, batch_id).get(1) == "done")
        batch.send([other])
        wait_until(lambda: _finished(batch.db, batch_id, "inconsistent"))
    assert "a second, different result" in _reason(batch.db, batch_id)


def test_batch_of_one_and_empty_batch(batch: bs.BatchSetup) -> None:
    """The empty batch is complete at once with no results; a batch of one waits for its item."""
    empty, single = bs.new_id(), bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(empty, ""), bs.accepted(single, "A")])
        # The two manifests may sit on different partitions: wait for both to be read.
        wait_until(lambda: _finished(batch.db, empty) and bs.status(batch.db, single) is not None)
        assert bs.status(batch.db, single) == ("waiting", None, 0)
        batch.send([bs.result(single, 1)])
        wait_until(lambda: _finished(batch.db, single))
    [nothing] = bs.outputs(batch.db, empty)
    assert nothing == {
        "batch_id": empty,
        "revision": 1,
        "expected_count": 0,
        "complete": True,
        "results": [],
        "missing_positions": [],
    }
    [one] = bs.outputs(batch.db, single)
    assert bs.positions(one) == [(1, "A")]
    assert one["complete"] is True


def test_seed_worked_example_step_by_step(batch: bs.BatchSetup) -> None:
    """C, A, E, B finish: wait on 4. D fails: incomplete, 4 missing. D retried, succeeds: A..E."""
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send([bs.result(batch_id, p) for p in (3, 1, 5, 2)])
        wait_until(lambda: sum(s == "done" for s in bs.states(batch.db, batch_id).values()) == 4)
        assert bs.states(batch.db, batch_id)[4] == "pending"
        assert bs.status(batch.db, batch_id) == ("waiting", None, 0)
        assert bs.outputs(batch.db, batch_id) == []

        batch.send([bs.result(batch_id, 4, ok=False)])
        wait_until(lambda: _finished(batch.db, batch_id, "incomplete"))
        [first] = bs.outputs(batch.db, batch_id)
        assert (first["complete"], first["missing_positions"]) == (False, [4])
        assert bs.positions(first) == [(1, "A"), (2, "B"), (3, "C"), (5, "E")]

        with batch.db.connect(autocommit=True) as conn:
            admin, shown = bs.batch_admin(batch, conn)
            admin.confirm_retry(None, batch_id, 4, applied_ref=None, by="ops", reason="input fixed")
        assert bs.work_items(batch.db, batch_id) == [(4, 2)]
        assert bs.status(batch.db, batch_id) == ("waiting", None, 1)
        batch.send([bs.result(batch_id, 4, attempt=2)])
        wait_until(lambda: _finished(batch.db, batch_id))
    first, second = bs.outputs(batch.db, batch_id)
    assert second["revision"] == 2
    assert second["complete"] is True
    assert bs.positions(second) == LETTERS
    assert shown[0][1][0]["decision"] == "retried"


def _held(
    db: PgSchema, services: Services, topic_factory: TopicFactory, tmp: Path
) -> tuple[bs.BatchSetup, str]:
    """A batch route with on_incomplete = hold, and a batch held by D's failure."""
    batch = bs.setup(db, services, topic_factory, tmp, on_incomplete="hold")
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send(
            [bs.result(batch_id, p) for p in (3, 1, 5, 2)] + [bs.result(batch_id, 4, ok=False)]
        )
        wait_until(lambda: _finished(batch.db, batch_id, "held"))
    return batch, batch_id


def test_held_batch_is_released_as_incomplete_by_a_person(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """With on_incomplete = hold, D's failure holds the batch; `decide` then assembles it."""
    batch, batch_id = _held(pg_schema, services, topic_factory, tmp_path)
    assert bs.outputs(batch.db, batch_id) == []
    with batch.db.connect(autocommit=True) as conn:
        admin, _ = bs.batch_admin(batch, conn)
        admin.decide(None, batch_id, "ops", "ship what we have")
    [output] = bs.outputs(batch.db, batch_id)
    assert (output["complete"], output["missing_positions"]) == (False, [4])
    assert "released by ops" in output["reason"]


@pytest.mark.parametrize("as_json", [True, False])
def test_decide_from_the_command_line_prints_its_outcome_and_exits_zero(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    as_json: bool,
) -> None:
    """`inorder-admin [--json] batches decide` releases a held batch and prints what it did."""
    batch, batch_id = _held(pg_schema, services, topic_factory, tmp_path)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("INORDER_")} | {
        "DATABASE_URL": batch.db.url,
        "KAFKA_BOOTSTRAP_SERVERS": services.kafka_bootstrap,
        "REDIS_URL": services.redis_url,
        "INORDER_ROUTES_FILE": str(batch.settings.routes_file),
    }
    flags = ["--json"] if as_json else []
    done = run_tool(
        "inorder-admin",
        environment,
        *flags,
        "batches",
        "decide",
        batch_id,
        "--by",
        "ops",
        "--reason",
        "ship it",
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    if as_json:
        [line] = done.stdout.splitlines()
        assert orjson.loads(line)["batch"] == batch_id
    assert batch_id in done.stdout
    [output] = bs.outputs(batch.db, batch_id)
    assert (output["complete"], output["missing_positions"]) == (False, [4])


def test_uncertain_failure_needs_review_and_is_never_retried(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """A time-out that may have written is not dispatched again, even with retries allowed."""
    batch = bs.setup(pg_schema, services, topic_factory, tmp_path, max_retries=3)
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send(
            [bs.result(batch_id, p) for p in (1, 2, 3, 5)]
            + [bs.result(batch_id, 4, ok=False, uncertain=True)]
        )
        wait_until(lambda: bs.states(batch.db, batch_id).get(4) == "needs_review")
        wait_until(lambda: _finished(batch.db, batch_id, "incomplete"))
    assert bs.work_items(batch.db, batch_id) == []
    with batch.db.connect(autocommit=True) as conn:
        admin, _ = bs.batch_admin(batch, conn)
        admin.confirm_retry(None, batch_id, 4, applied_ref="r/D", by="ops", reason="checked")
    assert bs.work_items(batch.db, batch_id) == []
    second = bs.outputs(batch.db, batch_id)[-1]
    assert second["complete"] is True
    assert bs.positions(second) == LETTERS


def test_certain_failure_is_dispatched_again_up_to_max_retries(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """With one retry allowed, D's first failure brings attempt 2; its failure ends the batch."""
    batch = bs.setup(pg_schema, services, topic_factory, tmp_path, max_retries=1)
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id)])
        batch.send(
            [bs.result(batch_id, p) for p in (1, 2, 3, 5)] + [bs.result(batch_id, 4, ok=False)]
        )
        wait_until(lambda: bs.work_items(batch.db, batch_id) == [(4, 2)])
        assert bs.status(batch.db, batch_id) == ("waiting", None, 0)
        batch.send([bs.result(batch_id, 4, ok=False)])  # attempt 1 again: stale
        batch.send([bs.result(batch_id, 4, attempt=2, ok=False)])
        wait_until(lambda: _finished(batch.db, batch_id, "incomplete"))
    assert bs.work_items(batch.db, batch_id) == [(4, 2)]
    [output] = bs.outputs(batch.db, batch_id)
    assert output["missing_positions"] == [4]


def test_manifest_changed_after_work_started_halts_assembly(batch: bs.BatchSetup) -> None:
    """Positions re-sorted in the manifest table after work started: the batch halts unassembled."""
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id), bs.result(batch_id, 1)])
        wait_until(lambda: bs.states(batch.db, batch_id).get(1) == "done")
        with batch.db.connect(autocommit=True) as conn:
            conn.execute(
                "UPDATE inorder_batch_items SET item_key = CASE position WHEN 4 THEN 'E' "
                "ELSE 'D' END WHERE batch_id = %s AND position IN (4, 5)",
                (batch_id,),
            )
        batch.send([bs.result(batch_id, p) for p in (2, 3)])
        batch.send([bs.result(batch_id, 4, "E"), bs.result(batch_id, 5, "D")])
        wait_until(lambda: _finished(batch.db, batch_id, "halted"))
    assert "digest" in _reason(batch.db, batch_id)
    assert bs.outputs(batch.db, batch_id) == []


def _reason(db: PgSchema, batch_id: str) -> str:
    found = bs.status(db, batch_id)
    assert found is not None
    return found[1] or ""


def test_results_before_their_manifest_are_kept_until_it_arrives(batch: bs.BatchSetup) -> None:
    """Results that beat the manifest to the consumer are kept in PostgreSQL, then applied."""
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.result(batch_id, p) for p in (4, 2, 5)])
        wait_until(lambda: _early(batch.db, batch_id) == 3)
        batch.send([bs.accepted(batch_id)])
        batch.send([bs.result(batch_id, p) for p in (1, 3)])
        wait_until(lambda: _finished(batch.db, batch_id))
    assert _early(batch.db, batch_id) == 0
    assert bs.positions(bs.outputs(batch.db, batch_id)[0]) == LETTERS


def test_results_waiting_for_a_manifest_are_bounded_and_expire_as_dead_letters(
    pg_schema: PgSchema, services: Services, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Past max_early_results a result is dead-lettered at once; kept ones past the TTL later."""
    batch = bs.setup(
        pg_schema, services, topic_factory, tmp_path,
        extra="max_early_results = 3\nearly_results_ttl_s = 1\n",
    )  # fmt: skip
    never, good = bs.new_id(), bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.result(never, p) for p in (1, 2, 3, 4, 5)])
        refused = drain(batch.services.kafka_bootstrap, batch.dlq, expect=2)
        wait_until(lambda: _early(batch.db, never) == 3)
        # The consumer goes on: a batch whose manifest comes first still assembles.
        batch.send([bs.accepted(good)])
        batch.send([bs.result(good, p) for p in (1, 2, 3, 4, 5)])
        wait_until(lambda: _finished(batch.db, good))
    assert bs.positions(bs.outputs(batch.db, good)[0]) == LETTERS
    details = [dict(m.headers() or [])[headers.DLQ_DETAIL].decode() for m in refused]
    assert all("max_early_results 3" in d for d in details), details
    time.sleep(1.2)
    assert bs.sweep_once(batch)["early_results_expired"] == 3
    assert _early(batch.db, never) == 0
    letters = drain(batch.services.kafka_bootstrap, batch.dlq, expect=5)
    expired = [m for m in letters if b"early_results_ttl_s" in _detail(m)]
    assert len(expired) == 3
    assert {schemas.decode(m.value()).entity_id for m in expired} | {
        schemas.decode(m.value()).entity_id for m in refused
    } == {f"{never}#{p}" for p in (1, 2, 3, 4, 5)}
    with batch.db.connect() as conn:
        rows = conn.execute(
            "SELECT count(*) FROM inorder_dead_letters WHERE reason = 'batch_rejected'"
            " AND entity_id LIKE %s",
            (f"{never}#%",),
        ).fetchone()
    assert rows == (5,)


def _detail(message: Any) -> bytes:
    return bytes(dict(message.headers() or [])[headers.DLQ_DETAIL])


def _early(db: PgSchema, batch_id: str) -> int:
    with db.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM inorder_batch_early_results WHERE batch_id = %s", (batch_id,)
        ).fetchone()
    return int(row[0]) if row else 0


def test_bad_batch_events_are_dead_lettered_with_the_reason(batch: bs.BatchSetup) -> None:
    """A result breaking its payload schema, or not filed as batch#position, is dead-lettered."""
    batch_id = bs.new_id()
    good = bs.result(batch_id, 1)
    broken = replace(good, event_id="x1", payload={"batch_id": batch_id})
    misfiled = replace(good, event_id="x2", entity_id="other#1")
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id), broken, misfiled])
        letters = drain(batch.services.kafka_bootstrap, batch.dlq, expect=2)
    reasons = sorted(dict(m.headers() or [])[headers.DLQ_REASON].decode() for m in letters)
    assert reasons == ["batch_rejected", "batch_rejected"]
    details = " ".join(dict(m.headers() or [])[headers.DLQ_DETAIL].decode() for m in letters)
    assert "position" in details
    assert "is not batch_id#position" in details


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("deadline_s", 2**31),
        ("deadline_s", 2**63),
        ("expected_count", 2**31),
        ("position", 2**31),
        ("position", 2**53 + 1),
    ],
)
def test_batch_numbers_past_their_columns_are_refused_and_later_batches_assemble(
    batch: bs.BatchSetup, field: str, value: int
) -> None:
    """A manifest or result whose number no column holds is dead-lettered; the next batch works."""
    batch_id, later = bs.new_id(), bs.new_id()
    if field == "position":
        good = bs.result(batch_id, 1)
        bad = replace(good, event_id="x1", payload={**good.payload, "position": value})
    else:
        manifest = bs.accepted(batch_id)
        bad = replace(manifest, payload={**manifest.payload, field: value})
    with cs.running(batch.settings):
        batch.send([bad, bs.accepted(later)])
        batch.send([bs.result(later, p) for p in (5, 3, 1, 4, 2)])
        letters = drain(batch.services.kafka_bootstrap, batch.dlq, expect=1)
        wait_until(lambda: _finished(batch.db, later))
    [letter] = letters
    found = dict(letter.headers() or [])
    assert found[headers.DLQ_REASON].decode() == "batch_rejected"
    assert field in found[headers.DLQ_DETAIL].decode()
    [output] = bs.outputs(batch.db, later)
    assert bs.positions(output) == LETTERS


def test_sweeper_abandons_pending_positions_past_the_deadline(batch: bs.BatchSetup) -> None:
    """Past its deadline, a batch's pending positions are abandoned and it assembles incomplete."""
    batch_id = bs.new_id()
    with cs.running(batch.settings):
        batch.send([bs.accepted(batch_id, deadline_s=1)])
        batch.send([bs.result(batch_id, p) for p in (1, 2, 3)])
        wait_until(lambda: sum(s == "done" for s in bs.states(batch.db, batch_id).values()) == 3)
    time.sleep(1.2)
    assert bs.sweep_once(batch)["batches_expired"] == 1
    [output] = bs.outputs(batch.db, batch_id)
    assert (output["complete"], output["missing_positions"]) == (False, [4, 5])
    assert "deadline passed" in output["reason"]
    assert "abandoned: 4, 5" in output["reason"]


def test_a_batch_reads_only_its_own_rows_when_plans_were_cached_while_tables_were_small(
    batch: bs.BatchSetup,
) -> None:
    """Statements prepared on near-empty tables, then 20,000 items: a batch reads its rows only."""
    applier = BatchApplier(batch.route)
    with batch.db.connect(autocommit=True) as conn:

        def one() -> str:
            batch_id = bs.new_id()
            applier.apply(conn, [bs.accepted(batch_id)], {})
            applier.apply(conn, [bs.result(batch_id, p) for p in (3, 1, 5, 2, 4)], {})
            return batch_id

        for _ in range(12):  # prepared after 5 runs, given a generic plan after 5 more
            one()
        conn.execute(
            "INSERT INTO inorder_batches (route, batch_id, generation, expected_count, digest, "
            "on_incomplete, deadline_s, deadline_at, status) SELECT 'batch', 'old-' || g, 1, 5, "
            "'d', 'assemble_incomplete', 60, now(), 'complete' FROM generate_series(1, 4000) g"
        )
        conn.execute(
            "INSERT INTO inorder_batch_items (route, batch_id, position, item_key, state) "
            "SELECT 'batch', 'old-' || g, p, 'k', 'done' "
            "FROM generate_series(1, 4000) g, generate_series(1, 5) p"
        )
        conn.execute("SELECT pg_stat_force_next_flush()")  # earlier counts out of the way
        with conn.transaction():
            batch_id = one()
            read = conn.execute(
                "SELECT relid::regclass::text, seq_tup_read + coalesce(idx_tup_fetch, 0) "
                "FROM pg_stat_xact_user_tables WHERE relid IN "
                "('inorder_batches'::regclass, 'inorder_batch_items'::regclass)"
            ).fetchall()
    assert bs.status(batch.db, batch_id) == ("complete", None, 1)
    # Each of the five positions is read a few times (results, writes, counts, assembly).
    assert all(rows <= 60 for _, rows in read), read


def _overdue(batch: bs.BatchSetup, batch_id: str, keys: list[str]) -> None:
    """A batch's manifest stored through the route, its deadline already passed."""
    with batch.db.connect(autocommit=True) as conn:
        BatchApplier(batch.route).apply(conn, [bs.accepted(batch_id, keys, deadline_s=1)], {})
        conn.execute(
            "UPDATE inorder_batches SET deadline_at = now() - interval '1 second' "
            "WHERE batch_id = %s",
            (batch_id,),
        )


def test_a_batch_of_300_pending_positions_expires_with_a_bounded_reason(
    batch: bs.BatchSetup,
) -> None:
    """No worker past the deadline, 300 positions: assembled incomplete, reason under 1,024."""
    batch_id = bs.new_id()
    _overdue(batch, batch_id, [f"k{i}" for i in range(300)])
    assert bs.sweep_once(batch)["batches_expired"] == 1
    [output] = bs.outputs(batch.db, batch_id)
    assert output["missing_positions"] == list(range(1, 301))
    assert len(output["reason"]) <= 1024
    assert "abandoned: 1, 2, 3" in output["reason"]
    assert "300 in all" in output["reason"]
    assert bs.status(batch.db, batch_id) == ("incomplete", output["reason"], 1)


def test_a_batch_id_too_long_for_its_outputs_is_stopped_at_its_manifest(
    batch: bs.BatchSetup,
) -> None:
    """A 250-character batch id (written by SQL, past the API): inconsistent at once, named."""
    long_id, later = "b" * 250, bs.new_id()
    made = bs.accepted("x")
    payload = {**made.payload, "batch_id": long_id} if "batch_id" in made.payload else made.payload
    manifest = replace(made, entity_id=long_id, event_id=f"m-{later}", payload=payload)
    with batch.db.connect(autocommit=True) as conn:
        BatchApplier(batch.route).apply(conn, [manifest, bs.accepted(later)], {})
    state, reason, _ = bs.status(batch.db, long_id) or ("", "", 0)
    assert state == "inconsistent"
    assert "batch_id is 250 characters" in (reason or "")
    with cs.running(batch.settings):
        batch.send([bs.result(later, p) for p in (5, 3, 1, 4, 2)])
        wait_until(lambda: _finished(batch.db, later))


def test_a_batch_whose_output_cannot_be_written_stops_alone_at_expiry(
    batch: bs.BatchSetup,
) -> None:
    """The outbox refuses one batch's assembly: that batch stopped inconsistent, the other done."""
    poison, fine = bs.new_id(), bs.new_id()
    for batch_id in (poison, fine):
        _overdue(batch, batch_id, ["a", "b"])
    with batch.db.connect(autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.entity_id = '{poison}' THEN RAISE EXCEPTION 'refused by a trigger'; END IF; "
            "RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON outbox "
            "FOR EACH ROW EXECUTE FUNCTION refuse_poison()"
        )
    assert bs.sweep_once(batch)["batches_expired"] == 2
    state, reason, _ = bs.status(batch.db, poison) or ("", "", 0)
    assert state == "inconsistent"
    assert "refused by a trigger" in (reason or "")
    assert bs.status(batch.db, fine) == ("incomplete", bs.outputs(batch.db, fine)[0]["reason"], 1)
    assert bs.sweep_once(batch)["batches_expired"] == 0  # not met again
