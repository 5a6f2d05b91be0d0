"""Kafka header names, defined once."""

from __future__ import annotations

# On every event.
EVENT_TYPE = "inorder-event-type"
ENTITY_TYPE = "inorder-entity-type"
# Present when the relay re-sent the event for a republish request; value = request id.
REPUBLISH_REQUEST = "inorder-republish-request"

# On dead letters: why, and where the message came from. All start with DLQ_PREFIX.
DLQ_PREFIX = "inorder-dlq-"
DLQ_REASON = "inorder-dlq-reason"
DLQ_DETAIL = "inorder-dlq-detail"
DLQ_TOPIC = "inorder-dlq-topic"
DLQ_PARTITION = "inorder-dlq-partition"
DLQ_OFFSET = "inorder-dlq-offset"
# Present when the dead-letter copy's value was cut; value = the original length.
DLQ_TRUNCATED_FROM = "inorder-dlq-truncated-from"

# The same facts under the names Kafka tooling reads on dead letters: Kafka Connect's
# (strings) and Spring Kafka's (partition a 4-byte and offset an 8-byte big-endian integer).
# The "exception" is inorder's reason code; its message, the detail.
CONNECT_TOPIC = "__connect.errors.topic"
CONNECT_PARTITION = "__connect.errors.partition"
CONNECT_OFFSET = "__connect.errors.offset"
CONNECT_EXCEPTION = "__connect.errors.exception.class.name"
CONNECT_MESSAGE = "__connect.errors.exception.message"
SPRING_TOPIC = "kafka_dlt-original-topic"
SPRING_PARTITION = "kafka_dlt-original-partition"
SPRING_OFFSET = "kafka_dlt-original-offset"
SPRING_EXCEPTION = "kafka_dlt-exception-fqcn"
SPRING_MESSAGE = "kafka_dlt-exception-message"
_TOOLING_PREFIXES = (DLQ_PREFIX, "__connect.errors.", "kafka_dlt-")

# On an event an operator replayed from a dead letter: how many times it was replayed.
REPLAYS = "inorder-replays"


def about_a_letter(name: str) -> bool:
    """Whether dead-lettering added the header (inorder's names or tooling's): replays drop them."""
    return name.startswith(_TOOLING_PREFIXES)
