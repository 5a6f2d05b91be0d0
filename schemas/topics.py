"""Default topic names, defined once; every process can override them in its settings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from schemas.errors import TopicSettingsError


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics inorder reads and writes."""

    # Events published from the outbox.
    events: str = "inorder.events"
    # Input the consumer could not use, with the reason in headers.
    dead_letters: str = "inorder.dead-letters"
    # Events of an entity whose parking cap was reached, kept for a person.
    held: str = "inorder.held"
    # The sweeper asks the relay to re-send a range of seqs.
    republish_requests: str = "inorder.republish.requests"
    # The relay answers what it re-sent and what it no longer has.
    republish_results: str = "inorder.republish.results"
    # Assembled batches, in position order.
    batch_output: str = "inorder.batch.output"
    # A batch's work items, one per position, for the workers.
    batch_work: str = "inorder.batch.work"


DEFAULT_TOPICS = Topics()


def replication(
    brokers: int, factor: int | None = None, min_insync: int | None = None
) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a new topic on ``brokers`` brokers.

    By default three replicas, or one per broker when there are fewer, and a majority
    of them in sync for a write but one replica of slack (3 -> 2, 5 -> 3, 2 -> 1, 1 -> 1),
    so an acks=all producer outlives the loss of one broker without losing a write.
    Raises ``TopicSettingsError`` naming the setting when the numbers cannot work.
    """
    factor = min(3, brokers) if factor is None else factor
    if factor > brokers:
        raise TopicSettingsError(
            f"INORDER_TOPIC_REPLICATION_FACTOR is {factor} but the cluster has {brokers} "
            f"broker(s); set it to {brokers} or less"
        )
    if min_insync is None:
        min_insync = max(1, min(factor - 1, factor // 2 + 1))
    if min_insync > factor:
        raise TopicSettingsError(
            f"INORDER_TOPIC_MIN_INSYNC_REPLICAS is {min_insync} but topics get {factor} "
            f"replica(s), so no write could succeed; set it to {factor} or less"
        )
    return factor, min_insync


def ensure_topics(
    config: dict[str, Any],
    names: Iterable[str],
    partitions: int,
    timeout_s: float = 30.0,
    *,
    factor: int | None = None,
    min_insync: int | None = None,
) -> list[str]:
    """Create the topics of ``names`` that do not exist yet; return those created.

    Replication follows ``replication`` for the number of brokers the cluster has now.
    Raises ``KafkaException`` when the cluster cannot be reached or refuses, and
    ``TopicSettingsError`` when the replication settings do not fit the cluster.
    """
    admin = AdminClient(config)
    metadata = admin.list_topics(timeout=timeout_s)
    missing = sorted({name for name in names if name not in metadata.topics})
    if not missing:
        return []
    replicas, in_sync = replication(len(metadata.brokers), factor, min_insync)
    futures = admin.create_topics(
        [
            NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replicas,
                config={"min.insync.replicas": str(in_sync)},
            )
            for name in missing
        ],
        operation_timeout=timeout_s,
    )
    for future in futures.values():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return missing
