"""Default topic names, defined once; every process can override them in its settings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic


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


def ensure_topics(
    config: dict[str, Any], names: Iterable[str], partitions: int, timeout_s: float = 30.0
) -> list[str]:
    """Create the topics of ``names`` that do not exist yet; return those created.

    Replication follows the broker's default. Raises ``KafkaException`` when the
    cluster cannot be reached or refuses.
    """
    admin = AdminClient(config)
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = sorted({name for name in names if name not in existing})
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=-1) for name in missing],
        operation_timeout=timeout_s,
    )
    for future in futures.values():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return missing
