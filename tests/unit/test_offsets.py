"""Offset bookkeeping: done offsets, revoked partitions, and commits that must be retried."""

from __future__ import annotations

from confluent_kafka import KafkaError, TopicPartition

from consumer.loop.offsets import Offsets


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
