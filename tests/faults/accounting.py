"""Each fuzzed input matched to what became of it, and judged against the oracle.

Inputs are matched to their dead letters by where they were written (partition and
offset, from the producer's delivery reports), never by anything inside them: a hostile
input may copy another's ids or carry no ids at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, TopicPartition

from schemas import headers
from tests.faults.conftest import Boundary
from tests.faults.oracle import Expect

Place = tuple[str, int, int]  # topic, partition, offset
EXAMPLES = 8


def letters(bootstrap: str, topic: str) -> dict[Place, list[str]]:
    """Every dead letter on ``topic`` so far: its original's place -> the reasons given."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"accounting-{topic}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 10_000_000,
        }
    )
    found: dict[Place, list[str]] = {}
    try:
        metadata = reader.list_topics(topic, timeout=30).topics[topic]
        ends = {}
        for partition in metadata.partitions:
            _, high = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            if high > 0:
                ends[partition] = high
        reader.assign([TopicPartition(topic, p, 0) for p in ends])
        read = dict.fromkeys(ends, 0)
        while any(read[p] < ends[p] for p in ends):
            for msg in reader.consume(500, timeout=2.0):
                if msg.error() is not None:
                    continue
                read[msg.partition()] = msg.offset() + 1
                named = {
                    k: v.decode(errors="replace") for k, v in msg.headers() or [] if v is not None
                }
                place = (
                    named.get(headers.DLQ_TOPIC, ""),
                    int(named.get(headers.DLQ_PARTITION, "-1")),
                    int(named.get(headers.DLQ_OFFSET, "-1")),
                )
                found.setdefault(place, []).append(named.get(headers.DLQ_REASON, ""))
    finally:
        reader.close()
    return found


def account(
    boundary: Boundary,
    inputs: Sequence[tuple[str, Expect]],
    places: Sequence[Place],
    dead: dict[Place, list[str]],
    applied: Callable[[int], bool],
) -> None:
    """Judge every input by its letters (and its effect, where one must show); tally them.

    An input is unaccounted when its letters break its expectation, when it must show an
    effect and does not, and a letter no input explains (a valid event's) is one too.
    Two letters of one reason for one input are a redelivery after a rewind, counted.
    """
    assert len(places) == len(inputs), "a delivery report is missing"
    expected, so = Counter[str](), Counter[str]()
    refused = Counter[str]()
    left = dict(dead)
    for i, ((what, expect), place) in enumerate(zip(inputs, places, strict=True)):
        got = left.pop(place, [])
        expected[expect.label] += 1
        problem = expect.judge(got)
        if problem is None and expect.applied and not applied(i):
            problem = f"expected {expect.label}, no effect shows"
        refused.update(got[:1])
        boundary.redelivered += max(0, len(got) - 1)
        if problem is None:
            so[expect.label] += 1
        else:
            _unaccounted(boundary, f"#{i} {what}: {problem}")
    for place, reasons in left.items():
        _unaccounted(boundary, f"a letter for {place} no input explains: {reasons}")
    boundary.tried = len(inputs)
    boundary.refused = dict(refused)
    boundary.taken = len(inputs) - refused.total()
    boundary.expected, boundary.as_expected = dict(expected), dict(so)


def _unaccounted(boundary: Boundary, what: str) -> None:
    boundary.unaccounted += 1
    if len(boundary.examples) < EXAMPLES:
        boundary.examples.append(what[:300])
