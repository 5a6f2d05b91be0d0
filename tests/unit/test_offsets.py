"""Offset bookkeeping: done offsets, revoked partitions, and commits that must be retried."""

from __future__ import annotations

from confluent_kafka import KafkaError, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.loop.offsets import Offsets
from tests.support.messages import StandIn


def _tp(partition: int, offset: int = -1001) -> TopicPartition:
    return TopicPartition("events", partition, offset)


def test_failed_async_commit_is_retried_with_the_latest_done_offset() -> None:
    """A commit refused during a rebalance is retried once, with what is done by then."""
    offsets = Offsets()
    offsets.done([_tp(0, 10), _tp(1, 5)])
    offsets.failed(KafkaError(KafkaError.ILLEGAL_GENERATION), [_tp(0, 10)])
    offsets.done([_tp(0, 12)])
    assert [(t.partition, t.offset) for t in offsets.take_retries()] == [(0, 12)]
    assert offsets.take_retries() == []


def test_successful_commits_need_no_retry() -> None:
    """A commit callback without errors leaves nothing to retry."""
    offsets = Offsets()
    offsets.done([_tp(0, 3)])
    offsets.failed(None, [_tp(0, 3)])
    assert offsets.take_retries() == []


def test_partitions_taken_away_are_neither_retried_nor_committed() -> None:
    """After a revoke, a failed commit of that partition is dropped, and so is its done offset."""
    offsets = Offsets()
    offsets.done([_tp(0, 7), _tp(1, 9)])
    offsets.failed(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [_tp(0, 7)])
    offsets.forget([_tp(0)])
    assert offsets.take_retries() == []
    assert [(t.partition, t.offset) for t in offsets.pending()] == [(1, 9)]
    offsets.assigned([_tp(0)])
    assert not offsets.revoked


def test_done_offsets_are_handed_to_one_commit_each_the_latest_per_partition() -> None:
    """Several batches between two commits make one commit: each partition's latest offset."""
    offsets = Offsets()
    offsets.done([_tp(0, 4), _tp(1, 2)])
    offsets.done([_tp(0, 9)])
    assert [(t.partition, t.offset) for t in offsets.take_unsent()] == [(0, 9), (1, 2)]
    assert offsets.take_unsent() == []
    offsets.done([_tp(1, 3)])
    offsets.forget([_tp(0)])
    assert [(t.partition, t.offset) for t in offsets.take_unsent()] == [(1, 3)]


def test_a_partition_taken_away_leaves_nothing_to_commit() -> None:
    """Offsets done on a partition that was then revoked are not committed by this consumer."""
    offsets = Offsets()
    offsets.done([_tp(2, 11)])
    offsets.forget([_tp(2)])
    assert offsets.take_unsent() == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.lists(st.booleans(), min_size=1, max_size=6), st.data()),
        min_size=1,
        max_size=12,
    )
)
def test_no_commit_passes_a_held_message_and_every_release_lets_commits_catch_up(
    batches: list[tuple[int, list[bool], st.DataObject]],
) -> None:
    """Held messages released in any order: each commit gives the first unfinished offset."""
    offsets = Offsets()
    end = {0: 0, 1: 0}
    held: dict[int, set[int]] = {0: set(), 1: set()}
    last = {0: 0, 1: 0}

    def check() -> None:
        for tp in offsets.pending():
            first_unfinished = min(held[tp.partition], default=end[tp.partition])
            assert tp.offset == first_unfinished
            assert tp.offset >= last[tp.partition]  # never backwards
            last[tp.partition] = tp.offset

    for partition, deferred, data in batches:
        start = end[partition]
        for i, carried in enumerate(deferred):
            if carried:
                offsets.hold(StandIn(offset=start + i, partition=partition))
                held[partition].add(start + i)
        end[partition] = start + len(deferred)
        offsets.done([_tp(partition, end[partition])])
        check()
        waiting = sorted((p, o) for p in held for o in held[p])
        for p, o in data.draw(
            st.lists(st.sampled_from(waiting), unique=True) if waiting else st.just([])
        ):
            offsets.release(StandIn(offset=o, partition=p))
            held[p].discard(o)
            check()
    for p, waiting_on in held.items():
        for o in sorted(waiting_on):
            offsets.release(StandIn(offset=o, partition=p))
        waiting_on.clear()
    assert offsets.held() == 0
    assert {tp.partition: tp.offset for tp in offsets.take_unsent()} == {
        p: end[p] for p in end if end[p]
    }


def test_a_partition_taken_away_drops_its_held_messages() -> None:
    """After a revoke nothing of the partition is held; a later release of it changes nothing."""
    offsets = Offsets()
    offsets.hold(StandIn(offset=4, partition=0))
    offsets.done([_tp(0, 9)])
    assert [(t.partition, t.offset) for t in offsets.pending()] == [(0, 4)]
    offsets.forget([_tp(0)])
    offsets.release(StandIn(offset=4, partition=0))
    assert (offsets.held(), offsets.pending()) == (0, [])
