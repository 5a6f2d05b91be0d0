"""Fuzz: thousands of broken envelopes among valid events, sent by kcat and by confluent-kafka.

The consumer runs as its own process. It must never die; every broken message
must reach the dead-letter topic with the reason its mutation calls for; every
valid event must be applied, and nothing broken may reach the projection.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from schemas import decode, headers
from tests.conftest import PgSchema, TopicFactory
from tests.faults import mutations
from tests.faults.conftest import FUZZ, Scale
from tests.faults.pipeline import Pipeline
from tests.support.services import Services

pytestmark = [pytest.mark.faults, pytest.mark.services, pytest.mark.timeout(900)]

KEY_SEP, END = "<<fz-key>>", "<<fz-end>>"
FID = "fuzz-id"


def send_with_kcat(bootstrap: str, topic: str, cases: list[mutations.Case]) -> None:
    """Produce the cases with kcat, a client that is not ours; the key carries the case id."""
    kcat = shutil.which("kcat")
    assert kcat, "kcat is missing: deploy/local/stack up installs it"
    body = b"".join(
        f"fz:{c.fid}{KEY_SEP}".encode() + (c.value or b"") + END.encode() for c in cases
    )
    subprocess.run(
        [
            kcat,
            "-P",
            "-b",
            bootstrap,
            "-t",
            topic,
            "-K",
            KEY_SEP,
            "-D",
            END,
            "-z",
            "none",
            "-X",
            "message.max.bytes=5000000",
        ],
        input=body,
        check=True,
        capture_output=True,
        timeout=300,
    )


def send_with_confluent(bootstrap: str, topic: str, cases: list[mutations.Case]) -> None:
    """Produce the cases with confluent-kafka; a header carries the case id, keys as generated."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": 5_000_000, "linger.ms": 5}
    )
    for case in cases:
        producer.produce(topic, case.value, case.key, headers=[(FID, str(case.fid))])
        producer.poll(0)
    assert producer.flush(60) == 0


def case_id(key: bytes | None, hdrs: list[tuple[str, bytes]] | None) -> int:
    """The fuzz case a (dead-lettered) message came from."""
    found = dict(hdrs or []).get(FID)
    if found is not None:
        return int(found)
    assert key is not None, "a message with neither a case id header nor a key"
    return int(key.removeprefix(b"fz:"))


def dead_letters(bootstrap: str, topic: str, expected: int) -> dict[int, list[str]]:
    """Case id -> reasons, read from the dead-letter topic until ``expected`` have come."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 10_000_000,
        }
    )
    reader.subscribe([topic])
    found: dict[int, list[str]] = {}
    count, deadline = 0, time.monotonic() + 180
    try:
        while count < expected and time.monotonic() < deadline:
            for msg in reader.consume(500, timeout=1.0):
                if msg.error() is not None:
                    continue
                hdrs = msg.headers() or []
                reason = dict(hdrs)[headers.DLQ_REASON].decode()
                found.setdefault(case_id(msg.key(), hdrs), []).append(reason)
                count += 1
        time.sleep(2)  # anything beyond the expected count would be a spurious dead letter
        for msg in reader.consume(500, timeout=2.0):
            if msg.error() is None:
                hdrs = msg.headers() or []
                found.setdefault(case_id(msg.key(), hdrs), []).append("extra")
    finally:
        reader.close()
    return found


def test_fuzzed_envelopes_are_dead_lettered_and_valid_ones_applied(
    pg_schema: PgSchema,
    services: Services,
    topic_factory: TopicFactory,
    tmp_path: Path,
    scale: Scale,
) -> None:
    """10,000+ mutations via kcat and confluent-kafka: no crash, right reasons, valid applied."""
    pipe = Pipeline(pg_schema, services, topic_factory, tmp_path)
    try:
        pipe.start("consumer-1")
        pipe.wait_for("consumer ready", lambda: pipe.ready("consumer-1"))
        cases = mutations.cases(scale.fuzz_messages, scale.fuzz_messages // 5, seed=20261130)
        by_kcat = [c for i, c in enumerate(cases) if i % 2 and c.key is not None]
        by_confluent = [c for c in cases if c not in set(by_kcat)]
        send_with_kcat(services.kafka_bootstrap, pipe.events_topic, by_kcat)
        send_with_confluent(services.kafka_bootstrap, pipe.events_topic, by_confluent)

        bad = [c for c in cases if c.expected != mutations.APPLIED]
        dlq = dead_letters(
            services.kafka_bootstrap, pipe.env["INORDER_DEAD_LETTER_TOPIC"], len(bad)
        )
        pipe.wait_for("consumer caught up", lambda: pipe.lag() == 0, timeout=120)

        wrong = [
            (c.kind, c.expected, dlq.get(c.fid)) for c in bad if dlq.get(c.fid) != [c.expected]
        ]
        good = {c.fid: c for c in cases if c.expected == mutations.APPLIED}
        spurious = [(good[f].kind, r) for f, r in dlq.items() if f in good]
        with pipe.db.connect() as conn:
            rows = dict(
                conn.execute(
                    "SELECT subscription_id, (generation, seq, plan, price_cents, status)::text "
                    "FROM billing_view"
                ).fetchall()
            )
        want = {}
        for case in good.values():
            event = decode(case.value)
            p = event.payload
            want[event.entity_id] = f"(1,1,{p['plan']},{p['price_cents']},active)"
        missing = [k for k in want if rows.get(k) != want[k]]
        extra = sorted(set(rows) - set(want))
        alive = pipe.processes["consumer-1"].popen.poll() is None
        log = (tmp_path / "consumer-1.log").read_text(errors="replace")

        reasons = Counter(r for rs in dlq.values() for r in rs)
        FUZZ.update(
            sent=len(cases),
            by_kcat=len(by_kcat),
            by_confluent=len(by_confluent),
            mutated=len(bad),
            dead_lettered=dict(sorted(reasons.items())),
            applied=len(want) - len(missing),
            valid=len(want),
            crashes=0 if alive and "Traceback" not in log else 1,
        )
        assert alive, "the consumer died"
        assert "Traceback" not in log
        assert not wrong, f"{len(wrong)} wrongly handled, e.g. {wrong[:5]}"
        assert not spurious, f"valid events dead-lettered: {spurious[:5]}"
        assert not missing, f"{len(missing)} valid events not applied, e.g. {missing[:5]}"
        assert not extra, f"broken events reached the projection: {extra[:5]}"
    finally:
        pipe.close()
