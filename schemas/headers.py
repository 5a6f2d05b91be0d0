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
