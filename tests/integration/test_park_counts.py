"""The parked-events gauge from counters the park scripts keep: always the true count
once settled, whatever the order of parks, copies, removals and lapsed sets, and read
without touching any entity's set."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.kinds.steps.parking import ParkingLot
from schemas.runtime.redis_client import RedisClient

ROUTE = "ledger"
CAP = (1000, 1 << 20)
ENTITIES = ["a", "b", "c", "d", "e"]

Op = tuple[str, str, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(["park", "park", "park", "remove", "lapse"]),
        st.sampled_from(ENTITIES),
        st.integers(1, 6),
    ),
    max_size=60,
)


def _lot(client: RedisClient, prefix: str) -> ParkingLot:
    return ParkingLot(client, prefix.rstrip(":"), buckets=4)


def _truth(lot: ParkingLot) -> int:
    return sum(len(lot.parked_seqs(ROUTE, e)) for e in ENTITIES)


def _settle(lot: ParkingLot) -> None:
    """What the sweeper does for entities whose set lapsed: drop their index entries."""
    gone = [e for e in ENTITIES if not lot.client.exists(lot.entity_key(ROUTE, e))]
    lot.unindex_empty(ROUTE, [e for e in gone if lot.indexed(ROUTE, [e])])


def _apply(lot: ParkingLot, steps: list[Op]) -> None:
    for action, entity, seq in steps:
        raw = f"{entity}:{seq}".encode()
        if action == "park":
            lot.park(ROUTE, [(entity, seq, raw)], CAP, 3600)
        elif action == "remove":
            lot.remove(ROUTE, {entity: [raw, f"{entity}:{seq + 1}".encode()]})
        else:  # its TTL lapsed: the set and its byte count go, the index entry stays
            lot.client.delete(lot.entity_key(ROUTE, entity), lot.bytes_key(ROUTE, entity))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=ops)
def test_the_counted_total_is_the_true_count_after_any_sequence(
    redis_client: RedisClient, redis_prefix: str, steps: list[Op]
) -> None:
    """Parks with copies, removals of present and absent members, lapsed sets: equal."""
    lot = _lot(redis_client, f"{redis_prefix}x{abs(hash(tuple(steps)))}")
    lot.totals(ROUTE)  # counted from the start
    _apply(lot, steps)
    _settle(lot)
    total, oldest = lot.totals(ROUTE)
    assert total == _truth(lot)
    indexed = [since for entity, since in lot._index_entries(ROUTE)]
    assert oldest == min(indexed, default=None)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(before=ops, after=ops)
def test_parks_written_before_the_counts_are_counted_on_the_first_read(
    redis_client: RedisClient, redis_prefix: str, before: list[Op], after: list[Op]
) -> None:
    """Counts missing (an earlier release parked): the first read counts the sets, and
    every change after keeps it true."""
    lot = _lot(redis_client, f"{redis_prefix}y{abs(hash((tuple(before), tuple(after))))}")
    _apply(lot, before)
    for key in lot.client.scan_iter(f"{lot.prefix}:park[ct]*"):  # no counts, no mark
        lot.client.delete(key)
    _settle(lot)
    assert lot.totals(ROUTE)[0] == _truth(lot)
    _apply(lot, after)
    _settle(lot)
    assert lot.totals(ROUTE)[0] == _truth(lot)


def test_reading_the_gauge_reads_no_entitys_set(
    redis_client: RedisClient, redis_prefix: str
) -> None:
    """Two hundred parked entities: the gauge's read sends no ZCARD and no whole ZRANGE."""
    lot = _lot(redis_client, redis_prefix)
    lot.park(ROUTE, [(f"e{n}", 1, f"e{n}:1".encode()) for n in range(200)], CAP, 3600)
    lot.totals(ROUTE)  # the first read counts
    before = _calls(redis_client)
    assert lot.totals(ROUTE)[0] == 200
    after = _calls(redis_client)
    assert after.get("zcard", 0) == before.get("zcard", 0)
    assert after.get("zrange", 0) - before.get("zrange", 0) == lot.buckets  # first entries


def _calls(client: RedisClient) -> dict[str, int]:
    stats: Any = client.info("commandstats")
    if isinstance(stats, dict) and all(isinstance(v, dict) for v in stats.values()):
        found: dict[str, int] = {}
        for name, value in stats.items():  # a cluster answers per node: add them up
            if isinstance(value, dict) and "calls" in value:
                key = name.removeprefix("cmdstat_")
                found[key] = found.get(key, 0) + int(value["calls"])
            elif isinstance(value, dict):
                for inner, counted in value.items():
                    key = str(inner).removeprefix("cmdstat_")
                    if isinstance(counted, dict):
                        found[key] = found.get(key, 0) + int(counted["calls"])
        return found
    return {}
