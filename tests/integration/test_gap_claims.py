"""Two sweepers acting on one gap: each republish attempt is claimed by one of them only."""

from __future__ import annotations

from consumer.kinds.steps import gaps
from tests.conftest import PgSchema
from tests.integration import step_support as ss


def test_a_sweeper_that_read_the_gap_before_another_asked_claims_nothing(
    pg_schema: PgSchema,
) -> None:
    """The attempt count read by a frozen sweeper has moved when it wakes: no second request."""
    ss.prepare(pg_schema)
    with pg_schema.connect(autocommit=True) as conn:
        assert gaps.open_gap(conn, ss.STREAM, "a", (1, 3, 4), "ledger.step")
        frozen = gaps.find(conn, ss.STREAM, "a")
        awake = gaps.find(conn, ss.STREAM, "a")
        assert frozen is not None
        assert awake is not None
        assert gaps.requested(conn, awake, "r1", 2.0, None)
        assert not gaps.requested(conn, frozen, "r1-frozen", 2.0, None)
        after = gaps.find(conn, ss.STREAM, "a")
        assert after is not None
        assert after.attempts == 1
        assert after.request_ids == ["r1"]  # the frozen sweeper's id was never recorded
        assert gaps.requested(conn, after, "r2", 4.0, None)  # the next attempt, read afresh
        asked = gaps.get(conn, after.id)
        assert asked is not None
        assert asked.request_ids == ["r1", "r2"]
        gaps.resolve(conn, after, gaps.GapStatus.HEALED, "sweeper", "range applied")
        stale = gaps.get(conn, after.id)
        assert stale is not None
        assert not gaps.requested(conn, stale, "r3", 8.0, None)  # a healed gap is never asked for


def test_a_skip_and_a_heal_meeting_on_one_gap_leave_the_first_decision(
    pg_schema: PgSchema,
) -> None:
    """The sweeper read the gap before a person skipped it: its heal changes nothing after."""
    ss.prepare(pg_schema)
    with pg_schema.connect(autocommit=True) as conn:
        assert gaps.open_gap(conn, ss.STREAM, "a", (1, 3, 3), "ledger.step")
        opened = gaps.find(conn, ss.STREAM, "a")
        assert opened is not None
        unrecoverable = gaps.GapStatus.UNRECOVERABLE
        assert gaps.resolve(conn, opened, unrecoverable, "sweeper", "purged", [3])
        seen_by_sweeper = gaps.find(conn, ss.STREAM, "a")
        seen_by_person = gaps.find(conn, ss.STREAM, "a")
        assert seen_by_sweeper is not None
        assert seen_by_person is not None
        assert not gaps.resolve(conn, opened, unrecoverable, "sweeper", "again", [3])  # stale
        assert gaps.resolve(conn, seen_by_person, gaps.GapStatus.SKIPPED, "ana", "lost upstream")
        assert not gaps.resolve(conn, seen_by_sweeper, gaps.GapStatus.HEALED, "sweeper", "late")
        final = gaps.get(conn, opened.id)
        assert final is not None
        decided = (final.status, final.resolved_by, final.reason)
        assert decided == ("skipped", "ana", "lost upstream")


def test_a_sweep_reads_only_the_gaps_their_entities_have_passed(pg_schema: PgSchema) -> None:
    """Of four open gaps, the two whose entity applied past them (or moved to a newer
    generation), oldest first and at most as many as asked; never a resolved one."""
    ss.prepare(pg_schema)
    with pg_schema.connect(autocommit=True) as conn:
        for entity, progress in (("past", (1, 9)), ("short", (1, 3)), ("newer", (2, 1))):
            assert gaps.open_gap(conn, ss.STREAM, entity, (1, 3, 5), "ledger.step")
            conn.execute(
                "INSERT INTO inorder_step_progress (route, entity_id, generation, last_applied) "
                "VALUES (%s, %s, %s, %s)",
                (ss.STREAM, entity, *progress),
            )
        assert gaps.open_gap(conn, ss.STREAM, "unknown", (1, 3, 5), "ledger.step")
        found = [gap.entity_id for gap in gaps.passed(conn, ss.STREAM, 10)]
        assert found == ["past", "newer"]
        assert [gap.entity_id for gap in gaps.passed(conn, ss.STREAM, 1)] == ["past"]
        first = gaps.find(conn, ss.STREAM, "past")
        assert first is not None
        assert gaps.resolve(conn, first, gaps.GapStatus.HEALED, "sweeper", "range applied")
        assert [gap.entity_id for gap in gaps.passed(conn, ss.STREAM, 10)] == ["newer"]
