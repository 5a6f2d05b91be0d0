"""The republish protocol between the sweeper and the relay, and its timing.

The sweeper sends a ``RepublishRequest`` for a gap; the relay answers with a
``RepublishResult``. Both sides share ``backoff_delays`` so the relay can refuse
an outbox retention shorter than the longest a consumer may still ask.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cache
from typing import Any

import orjson

from schemas.errors import DecodeError
from schemas.files import json_schema
from schemas.keys import kafka_key
from schemas.limits import value_problem
from schemas.validation import Validator, first_error, validator_for


@dataclass(frozen=True, slots=True)
class RepublishRequest:
    """Re-send seqs ``from_seq..to_seq`` (inclusive) of one entity generation."""

    request_id: str
    entity_type: str
    entity_id: str
    generation: int
    from_seq: int
    to_seq: int
    reason: str

    @property
    def key(self) -> bytes:
        """Kafka key: the entity, so requests for one entity stay in order."""
        return kafka_key(self.entity_type, self.entity_id)

    @property
    def seqs(self) -> range:
        """The seqs asked for."""
        return range(self.from_seq, self.to_seq + 1)


@dataclass(frozen=True, slots=True)
class RepublishResult:
    """What the relay did with a request."""

    request_id: str
    entity_type: str
    entity_id: str
    generation: int
    from_seq: int
    to_seq: int
    resent: tuple[int, ...]
    missing: tuple[int, ...]
    failed: tuple[int, ...]
    cooldown: bool

    @property
    def key(self) -> bytes:
        """Kafka key: the entity."""
        return kafka_key(self.entity_type, self.entity_id)


@cache
def _validator(name: str) -> Validator:
    return validator_for(json_schema(name))


def _decode(raw: bytes | None, name: str, cls: type) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw or b"")
    except orjson.JSONDecodeError as exc:
        raise DecodeError("not_json", f"{name} is not JSON", raw) from exc
    beyond = value_problem(doc, where=name)
    if beyond is not None:  # what no text column or serializer on the way could take
        raise DecodeError(beyond[0], beyond[1], raw)
    problem = first_error(_validator(name), doc)
    if problem is not None:
        raise DecodeError("invalid", f"{name} {problem}", raw)
    return {f.name: doc[f.name] for f in fields(cls)}


def decode_request(raw: bytes | None) -> RepublishRequest:
    """Parse and validate a request; ``DecodeError`` names what is wrong."""
    doc = _decode(raw, "republish_request", RepublishRequest)
    if doc["from_seq"] > doc["to_seq"]:
        raise DecodeError("invalid", "republish_request from_seq is above to_seq", raw)
    return RepublishRequest(**doc)


def decode_result(raw: bytes | None) -> RepublishResult:
    """Parse and validate a result."""
    doc = _decode(raw, "republish_result", RepublishResult)
    for name in ("resent", "missing", "failed"):
        doc[name] = tuple(doc[name])
    return RepublishResult(**doc)


def encode(message: RepublishRequest | RepublishResult) -> bytes:
    """Either message as compact JSON."""
    return orjson.dumps(asdict(message))


def backoff_delays(base_s: float, max_s: float, attempts: int) -> list[float]:
    """Waits before each repeat of a request: base, 2*base, 4*base, ... capped at max_s."""
    return [min(max_s, base_s * 2.0**i) for i in range(attempts)]


def worst_case_repair_s(gap_deadline_s: float, base_s: float, max_s: float, attempts: int) -> float:
    """Longest time after an event's first park that a consumer may still ask for it."""
    return gap_deadline_s + sum(backoff_delays(base_s, max_s, attempts))
