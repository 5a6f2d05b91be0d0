"""codec_decode_per_s and codec_decode_vs_json: the orjson codec against json + JSON Schema.

All decode the same messages in the same run, alternating, best of several rounds.
The baseline is what a straightforward consumer would write: ``json.loads``, validate
against the envelope schema with the pure-Python ``jsonschema``, build the event. A
second baseline validates with the compiled jsonschema-rs instead.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import jsonschema

import schemas
from schemas.files import envelope_schema
from schemas.validation import validator_for as rs_validator_for
from tests.benchmarks.result import BenchResult
from tests.benchmarks.scale import sized

MESSAGES = sized(5000, 200)
ROUNDS = sized(5, 1)


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


def _baseline(validate: Callable[[object], None]) -> Callable[[bytes], schemas.Event]:
    def decode(raw: bytes) -> schemas.Event:
        doc = json.loads(raw)
        validate(doc)
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
    python_baseline = _baseline(jsonschema.Draft202012Validator(envelope_schema()).validate)
    rs_baseline = _baseline(rs_validator_for(envelope_schema()).validate)
    codec_best = py_best = rs_best = 0.0
    for _ in range(ROUNDS):
        codec_best = max(codec_best, _rate(schemas.decode, messages))
        py_best = max(py_best, _rate(python_baseline, messages))
        rs_best = max(rs_best, _rate(rs_baseline, messages))
    how = f"{MESSAGES} envelopes, best of {ROUNDS} alternating rounds"
    return [
        BenchResult("codec_decode_per_s", codec_best, "msg/s", how),
        BenchResult("codec_decode_baseline_per_s", py_best, "msg/s", "json + jsonschema"),
        BenchResult("codec_decode_vs_json", codec_best / py_best, "x", "codec / json + jsonschema"),
        BenchResult(
            "codec_decode_vs_json_rs", codec_best / rs_best, "x", "codec / json + jsonschema-rs"
        ),
    ]
