"""The parking key layout: one slot per script call, buckets spread over the cluster."""

from __future__ import annotations

import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from consumer.kinds.steps.parking import ParkingLot, bucket_of


def _lot(buckets: int = 16) -> ParkingLot:
    # Key names only: the client never connects.
    return ParkingLot(redis.Redis(host="127.0.0.1", port=1), "inorder", buckets)


@given(route=st.from_regex(r"[a-z_]{1,12}", fullmatch=True), entity=st.text(min_size=1))
def test_an_entity_set_and_its_index_share_one_slot(route: str, entity: str) -> None:
    """Each park and removal script touches two keys; on a cluster both must be in one slot."""
    lot = _lot()
    assert key_slot(lot.entity_key(route, entity).encode()) == key_slot(
        lot.index_key(route, entity).encode()
    )
    assert lot.index_key(route, entity) in lot.index_keys(route)


def test_a_route_is_spread_over_its_buckets_and_many_slots() -> None:
    """1,000 entities fill all 16 buckets, whose indexes sit in 16 distinct slots."""
    lot = _lot()
    used = {bucket_of(f"order-{i}", 16) for i in range(1000)}
    assert used == set(range(16))
    assert len({key_slot(k.encode()) for k in lot.index_keys("ledger")}) == 16


def test_an_entity_keeps_its_bucket_across_processes() -> None:
    """The bucket is a CRC-32 of the id, not Python's per-process salted hash."""
    assert bucket_of("a", 16) == 0xE8B7BE43 % 16
    assert _lot().entity_key("ledger", "a") == "inorder:park:{ledger:3}:a"
