"""The event contract: envelope, payload schemas, codec, Kafka keys, topic and header names.

The JSON Schema files in ``schemas/json`` are the source of truth; the codec here
agrees with them (``tests/unit/test_codec_schema_agreement.py`` proves it).
"""

from schemas.codec import (
    MAX_MESSAGE_BYTES,
    decode,
    encode,
    encode_rendered,
    rendered_types,
    to_document,
)
from schemas.errors import (
    ContractError,
    DecodeError,
    InorderError,
    PayloadError,
    UnknownEventTypeError,
)
from schemas.event import Event, default_event_id
from schemas.keys import kafka_key, parse_key
from schemas.topics import DEFAULT_TOPICS, Topics
from schemas.validation import PayloadSchemas

# inorder's four top-level packages; the other three check that ``schemas`` is this one.
PACKAGES = ("schemas", "producer", "outbox_relay", "consumer")

__all__ = [
    "DEFAULT_TOPICS",
    "MAX_MESSAGE_BYTES",
    "PACKAGES",
    "ContractError",
    "DecodeError",
    "Event",
    "InorderError",
    "PayloadError",
    "PayloadSchemas",
    "Topics",
    "UnknownEventTypeError",
    "decode",
    "default_event_id",
    "encode",
    "encode_rendered",
    "kafka_key",
    "parse_key",
    "rendered_types",
    "to_document",
]
