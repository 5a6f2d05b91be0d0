"""Replication of the topics the services create, decided from the number of brokers."""

from __future__ import annotations

import pytest

from schemas.errors import TopicSettingsError
from schemas.topics import replication


@pytest.mark.parametrize(
    ("brokers", "expected"), [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (6, (3, 2))]
)
def test_defaults_follow_the_broker_count(brokers: int, expected: tuple[int, int]) -> None:
    """Three replicas where there are three brokers or more, two of them in sync for a write."""
    assert replication(brokers) == expected


def test_five_replicas_need_three_in_sync() -> None:
    """A majority in sync, one replica of slack: 5 replicas -> 3."""
    assert replication(5, factor=5) == (5, 3)


def test_more_replicas_than_brokers_is_refused_naming_the_setting() -> None:
    """The error names INORDER_TOPIC_REPLICATION_FACTOR and the value that would work."""
    with pytest.raises(TopicSettingsError) as refused:
        replication(1, factor=3)
    assert str(refused.value) == (
        "INORDER_TOPIC_REPLICATION_FACTOR is 3 but the cluster has 1 broker(s); set it to 1 or less"
    )


def test_more_in_sync_than_replicas_is_refused() -> None:
    """min.insync.replicas above the replica count would refuse every acks=all write."""
    with pytest.raises(TopicSettingsError, match="INORDER_TOPIC_MIN_INSYNC_REPLICAS is 4"):
        replication(3, min_insync=4)
