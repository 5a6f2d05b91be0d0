"""codec_decode_per_s and codec_decode_vs_json: the orjson codec against json + JSON Schema.

Both decode the same messages in the same run, alternating, best of several rounds.
The baseline is what a straightforward consumer would write: ``json.loads``, validate
against the envelope schema, build the event.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import schemas
from schemas.files import envelope_schema
from schemas.validation import validator_for
from tests.benchmarks.result import BenchResult

MESSAGES = 5000
ROUNDS = 5


def _messages() -> list[bytes]:
    rng = random.Random(3)
    plans = ("free", "basic", "pro", "enterprise")
    out = []
    for i in range(MESSAGES):
        plan = rng.choice(plans)
        event = schemas.Event(
            event_id=f"subscription:sub-{i % 500}:1:{i}",
            event_type="subscription.plan_changed",
            entity_type="subscription",
            entity_id=f"sub-{i % 500:06d}",
            generation=1,
            seq=i + 1,
            occurred_at="2026-11-30T10:00:00.123456+00:00",
            published_at="2026-11-30T10:00:00.200000+00:00",
            payload={"plan": plan, "price_cents": rng.randint(0, 9900), "status": "active"},
        )
        out.append(schemas.encode(event))
    return out


def _baseline() -> Callable[[bytes], schemas.Event]:
    validator = validator_for(envelope_schema())

    def decode(raw: bytes) -> schemas.Event:
        doc = json.loads(raw)
        validator.validate(doc)
        return schemas.Event(**doc)

    return decode


def _rate(decode: Callable[[bytes], object], messages: list[bytes]) -> float:
    started = time.perf_counter()
    for raw in messages:
        decode(raw)
    return len(messages) / (time.perf_counter() - started)


def run() -> list[BenchResult]:
    """Decode rate of the codec, and its ratio to the json + schema baseline."""
    messages = _messages()
    baseline = _baseline()
    codec_best = base_best = 0.0
    for _ in range(ROUNDS):
        codec_best = max(codec_best, _rate(schemas.decode, messages))
        base_best = max(base_best, _rate(baseline, messages))
    how = f"{MESSAGES} envelopes, best of {ROUNDS} alternating rounds"
    return [
        BenchResult("codec_decode_per_s", codec_best, "msg/s", how),
        BenchResult("codec_decode_baseline_per_s", base_best, "msg/s", "json.loads + jsonschema"),
        BenchResult("codec_decode_vs_json", codec_best / base_best, "x", "codec / baseline"),
    ]
